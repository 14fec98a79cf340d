// A vector that keeps up to N elements inline and moves to the heap beyond that; used where a
// per-operation container (a graph node's inputs and outputs) would otherwise cost an allocation.
#pragma once

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <new>
#include <utility>

namespace kusari {

template <typename T, size_t N>
class SmallVector {
 public:
  SmallVector() = default;
  SmallVector(std::initializer_list<T> init) {
    reserve(init.size());
    for (const T& v : init) push_back(v);
  }
  SmallVector(const SmallVector& o) {
    reserve(o.size_);
    for (const T& v : o) push_back(v);
  }
  SmallVector(SmallVector&& o) noexcept { take(std::move(o)); }
  SmallVector& operator=(const SmallVector& o) {
    if (this != &o) {
      clear();
      reserve(o.size_);
      for (const T& v : o) push_back(v);
    }
    return *this;
  }
  SmallVector& operator=(SmallVector&& o) noexcept {
    if (this != &o) {
      destroy_all();
      take(std::move(o));
    }
    return *this;
  }
  ~SmallVector() { destroy_all(); }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* data() { return ptr(); }
  const T* data() const { return ptr(); }
  T* begin() { return ptr(); }
  T* end() { return ptr() + size_; }
  const T* begin() const { return ptr(); }
  const T* end() const { return ptr() + size_; }
  T& operator[](size_t i) { return ptr()[i]; }
  const T& operator[](size_t i) const { return ptr()[i]; }
  T& back() { return ptr()[size_ - 1]; }

  void reserve(size_t n) {
    if (n <= capacity_) return;
    T* fresh = static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(alignof(T))));
    T* old = ptr();
    for (size_t i = 0; i < size_; ++i) {
      new (fresh + i) T(std::move(old[i]));
      old[i].~T();
    }
    release_heap();
    heap_ = fresh;
    capacity_ = n;
  }

  void push_back(const T& v) { emplace_back(v); }
  void push_back(T&& v) { emplace_back(std::move(v)); }
  template <typename... Args>
  T& emplace_back(Args&&... args) {
    if (size_ == capacity_) reserve(std::max<size_t>(capacity_ * 2, 1));
    T* p = new (ptr() + size_) T(std::forward<Args>(args)...);
    ++size_;
    return *p;
  }
  void clear() {
    for (size_t i = 0; i < size_; ++i) ptr()[i].~T();
    size_ = 0;
  }

 private:
  T* ptr() { return heap_ ? heap_ : reinterpret_cast<T*>(inline_); }
  const T* ptr() const { return heap_ ? heap_ : reinterpret_cast<const T*>(inline_); }
  void release_heap() {
    if (heap_) ::operator delete(heap_, std::align_val_t(alignof(T)));
    heap_ = nullptr;
  }
  void destroy_all() {
    clear();
    release_heap();
    capacity_ = N;
  }
  void take(SmallVector&& o) {
    if (o.heap_) {
      heap_ = o.heap_;
      capacity_ = o.capacity_;
      size_ = o.size_;
      o.heap_ = nullptr;
      o.size_ = 0;
      o.capacity_ = N;
    } else {
      for (size_t i = 0; i < o.size_; ++i) new (reinterpret_cast<T*>(inline_) + i) T(std::move(o.ptr()[i]));
      size_ = o.size_;
      o.clear();
    }
  }

  alignas(T) unsigned char inline_[N * sizeof(T)];
  T* heap_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = N;
};

}  // namespace kusari
