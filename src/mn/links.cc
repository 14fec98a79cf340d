#include "kusari/mn/links.h"

#include <deque>
#include <map>
#include <utility>

#include "kusari/mn/functions.h"
#include "kusari/mn/object.h"

namespace kusari::mn {

MultiNodeChainList::MultiNodeChainList(std::shared_ptr<Communicator> comm)
    : comm_(std::move(comm)) {
  KUSARI_CHECK(comm_, ValueError, "MultiNodeChainList: the communicator is null");
}

void MultiNodeChainList::add_piece(std::shared_ptr<Link> link, std::optional<int> rank_in,
                                   std::optional<int> rank_out) {
  const size_t i = pieces_.size();
  KUSARI_CHECK(link, ValueError, "MultiNodeChainList::add_link: piece ", i, " is a null link");
  for (auto [what, r] : {std::pair{"rank_in", rank_in}, std::pair{"rank_out", rank_out}}) {
    KUSARI_CHECK(!r || (*r >= 0 && *r < comm_->size()), ValueError,
                 "MultiNodeChainList::add_link: piece ", i, " has ", what, " = ", *r,
                 ", outside the communicator's ranks 0..", comm_->size() - 1);
  }
  if (!rank_out) {
    for (size_t j = 0; j < pieces_.size(); ++j) {
      KUSARI_CHECK(pieces_[j].rank_out.has_value(), ValueError,
                   "MultiNodeChainList::add_link: piece ", i, " and piece ", j,
                   " both have no rank_out; at most one piece may produce the model output");
    }
  }
  ChainList::append(std::move(link));
  pieces_.push_back({rank_in, rank_out});
}

Variable MultiNodeChainList::forward(const Variable& x) {
  const int me = comm_->rank();
  KUSARI_CHECK(!pieces_.empty(), ValueError, "MultiNodeChainList::forward: rank ", me,
               " holds no pieces; add them with add_link");
  KUSARI_CHECK(size() == pieces_.size(), ValueError, "MultiNodeChainList::forward: it has ", size(),
               " links but ", pieces_.size(),
               " pieces; register links with add_link, not through a base class");
  Variable delegate;  // depends on every communication so far (Note [MultiNodeChainList wiring])
  Variable y;         // the model output, when this rank produces it
  std::deque<Variable> own;  // outputs this rank sent to itself, oldest first
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const Piece& piece = pieces_[i];
    Link& f = (*this)[i];
    Variable h;
    if (!piece.rank_in) {
      KUSARI_CHECK(
          x.defined(), ValueError, "MultiNodeChainList::forward: piece ", i,
          " takes the model input (no rank_in) but forward got an undefined variable on rank ", me);
      h = pseudo_connect(delegate, f.forward(x));
    } else if (*piece.rank_in == me) {
      KUSARI_CHECK(!own.empty(), ValueError, "MultiNodeChainList::forward: piece ", i,
                   " receives from rank ", me,
                   " (itself), but no earlier piece sent its output to rank ", me);
      Variable in = own.front();
      own.pop_front();
      h = f.forward(in.is(delegate) ? in : pseudo_connect(delegate, in));
    } else {
      h = f.forward(recv(*comm_, *piece.rank_in, delegate, 0, f.device()));
    }
    if (!piece.rank_out) {
      y = h;
      delegate = h;
    } else if (*piece.rank_out == me) {
      own.push_back(h);
      delegate = h;
    } else {
      delegate = send(h, *comm_, *piece.rank_out);
    }
  }
  KUSARI_CHECK(own.empty(), ValueError, "MultiNodeChainList::forward: ", own.size(),
               " output(s) sent by rank ", me, " to itself were never received by a later piece");
  if (!y.defined()) return delegate;
  if (y.is(delegate)) return y;
  return pseudo_connect(delegate, y);
}

Variable MultiNodeChainList::forward_batch(const std::vector<Variable>& batch) {
  return forward(batch.empty() ? Variable() : batch.front());
}

void MultiNodeChainList::validate() {
  ByteWriter w;
  w.put<int32_t>(static_cast<int32_t>(pieces_.size()));
  for (const Piece& p : pieces_) {
    w.put<int32_t>(p.rank_in.value_or(-1));
    w.put<int32_t>(p.rank_out.value_or(-1));
  }
  std::vector<Bytes> all = comm_->allgather_obj(w.take());
  // Every rank checks the same data in the same order, so every rank throws the same error.
  std::map<std::pair<int, int>, int> sends, recvs;  // (from, to) -> count
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    ByteReader rd(all[static_cast<size_t>(r)]);
    const int n = rd.get<int32_t>();
    int queued = 0;
    for (int i = 0; i < n; ++i) {
      const int in = rd.get<int32_t>(), out = rd.get<int32_t>();
      if (in == r) {
        KUSARI_CHECK(queued > 0, ValueError, "MultiNodeChainList::validate: on rank ", r,
                     ", piece ", i, " receives from rank ", r,
                     " (itself), but no earlier piece sent its output there");
        --queued;
      } else if (in >= 0) {
        ++recvs[{in, r}];
      }
      if (out == r) {
        ++queued;
      } else if (out >= 0) {
        ++sends[{r, out}];
      }
    }
    KUSARI_CHECK(queued == 0, ValueError, "MultiNodeChainList::validate: on rank ", r, ", ", queued,
                 " output(s) sent to rank ", r, " itself are never received by a later piece");
  }
  for (int a = 0; a < comm_->size(); ++a) {
    for (int b = 0; b < comm_->size(); ++b) {
      const int s = sends[{a, b}], n = recvs[{a, b}];
      KUSARI_CHECK(s == n, ValueError, "MultiNodeChainList::validate: rank ", a, " sends ", s,
                   " output(s) to rank ", b, ", but rank ", b, " receives ", n,
                   " input(s) from rank ", a, "; every add_link(..., rank_out = ", b, ") on rank ",
                   a, " needs an add_link(..., rank_in = ", a, ", ...) on rank ", b);
    }
  }
}

}  // namespace kusari::mn
