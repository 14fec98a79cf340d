"""Differentiable functions written in Python (Chainer's FunctionNode).

    class Square(kusari.FunctionNode):
        def forward(self, inputs):
            x, = inputs                      # NumPy arrays on the CPU
            self.retain_inputs((0,))
            return x * x,

        def backward(self, indexes, grad_outputs):
            x, = self.get_retained_inputs()  # Variables
            gy, = grad_outputs
            return 2 * x * gy,

    y, = Square().apply((x,))

Note [Python functions]
apply() runs forward on the inputs' arrays, then records the node in kusari's graph with a backward
rule that calls backward (under the GIL) with the output gradients as Variables; backward is
written with differentiable functions, so the gradient can be differentiated again. The inputs are
always kept for backward (get_retained_inputs); outputs only when retain_outputs asked for them.
"""

from kusari import _kusari


class FunctionNode(object):
    """A differentiable function whose forward and backward are written in Python."""

    def apply(self, inputs):
        """Applies the function to a tuple of inputs (Variables or arrays); returns a tuple of Variables."""
        return tuple(_kusari._apply_function(self, tuple(inputs)))

    def forward(self, inputs):
        """Computes the outputs (a tuple of arrays) from the inputs' arrays."""
        raise NotImplementedError('{}: define forward(self, inputs)'.format(type(self).__name__))

    def backward(self, target_input_indexes, grad_outputs):
        """Returns the inputs' gradients (Variables, None for no gradient) from the outputs'."""
        raise NotImplementedError('{}: define backward(self, target_input_indexes, grad_outputs)'.format(
            type(self).__name__))

    def retain_inputs(self, indexes):
        """Chainer's call; every input is kept for backward anyway."""
        self._kusari_retained_inputs = tuple(indexes)

    def retain_outputs(self, indexes):
        """Keeps the outputs at `indexes` for backward (get_retained_outputs)."""
        self._kusari_retained_outputs = tuple(indexes)

    def get_retained_inputs(self):
        """The retained inputs as Variables (every input when retain_inputs was not called)."""
        inputs = getattr(self, '_kusari_input_vars', ())
        indexes = getattr(self, '_kusari_retained_inputs', None)
        if indexes is None:
            return tuple(inputs)
        return tuple(inputs[i] for i in indexes)

    def get_retained_outputs(self):
        """The retained outputs as Variables, in the order retain_outputs named them."""
        return tuple(getattr(self, '_kusari_output_vars', ()))

    @property
    def label(self):
        return type(self).__name__
