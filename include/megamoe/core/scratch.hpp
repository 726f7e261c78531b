// SPDX-License-Identifier: Apache-2.0
// megamoe/core/scratch.hpp — memory a computation needs only while it runs, shared by every layer.
//
// A stage opens a frame and takes buffers from it in a fixed order; when the frame ends, the
// buffers go back. The i-th buffer of a frame at a given depth is always the same grow-only
// buffer, so layers that run one after the other share it, and a step allocates nothing once the
// largest step has run. A buffer's contents last until its frame ends.
//
//   auto frame = scratch.open();
//   float* rows = frame.take(n * h);       // valid until `frame` ends
//   buffer<float>& workspace = frame.next();  // a whole grow-only buffer, to reserve later
#pragma once

#include <megamoe/core/buffer.hpp>

#include <cstddef>
#include <deque>

namespace megamoe {

template <class T>
class scratch_stack {
 public:
  scratch_stack() = default;
  scratch_stack(scratch_stack const&) = delete;
  scratch_stack& operator=(scratch_stack const&) = delete;

  /// Buffers taken from the stack until the frame ends (frames nest, last in first out).
  class frame {
   public:
    explicit frame(scratch_stack& stack) : stack_(&stack), base_(stack.depth_) {}
    ~frame() { stack_->depth_ = base_; }
    frame(frame const&) = delete;
    frame& operator=(frame const&) = delete;

    /// The next buffer of the stack, as a whole (grow-only; reserve what is needed).
    buffer<T>& next() {
      if (stack_->depth_ == stack_->buffers_.size()) stack_->buffers_.emplace_back();
      return stack_->buffers_[stack_->depth_++];
    }
    /// The next buffer with room for `elements`.
    T* take(std::size_t elements) { return next().reserve(elements); }

   private:
    scratch_stack* stack_;
    std::size_t base_;
  };

  [[nodiscard]] frame open() { return frame(*this); }

  /// Bytes held by every buffer of the stack.
  [[nodiscard]] std::size_t capacity_bytes() const noexcept {
    std::size_t total = 0;
    for (auto const& b : buffers_) total += b.capacity_bytes();
    return total;
  }

 private:
  std::deque<buffer<T>> buffers_;  // a deque: references stay valid as it grows
  std::size_t depth_ = 0;
};

}  // namespace megamoe
