// SPDX-License-Identifier: Apache-2.0
// megamoe/core/stash.hpp — what a module keeps from one micro-batch's forward for its backward,
// set aside while other micro-batches run through the module.
//
// A pipeline schedule runs several micro-batches' forwards through a stage before their
// backwards. Each module names the members its backward reads; park(key, members...) swaps them
// with a free slot, restore(key, members...) swaps the key's slot back in. Swapping moves storage
// (matrices, vectors and buffers change owners), so nothing is copied per micro-batch. A slot is
// made once, as a copy of the live members where they copy (sizes and settings carry over) and
// empty where they do not, then reused: a steady schedule allocates nothing.
#pragma once

#include <megamoe/core/error.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace megamoe {

namespace detail {
/// Whether a T copies (std::is_copy_constructible says yes for any vector).
template <class T>
struct copies : std::is_copy_constructible<T> {};
template <class T, class A>
struct copies<std::vector<T, A>> : copies<T> {};
template <class T, std::size_t N>
struct copies<std::array<T, N>> : copies<T> {};
}  // namespace detail

// park, restore and a new slot's copies are defined outside the class and not inlined: they run
// once per micro-batch, and kept out of the modules' forwards and backwards they leave those
// functions small for the optimizer, which a configuration's unit compiles faster
// (docs/design.md); a module compiled once per element type declares its stash's instantiation
// `extern template` beside its own.
template <class... Saved>
class activation_stash {
 public:
  /// Sets the live members aside under `key` (a micro-batch); they are left holding a free slot's
  /// storage, which the next forward overwrites.
  [[gnu::noinline]] void park(std::uint64_t key, Saved&... live);
  /// Brings back what park(key) set aside; the live members' storage becomes a free slot.
  [[gnu::noinline]] void restore(std::uint64_t key, Saved&... live);
  /// Micro-batches set aside now.
  [[nodiscard]] std::size_t parked() const noexcept { return kept_.size(); }
  /// Forgets every set-aside micro-batch (a step that failed part-way); their storage is reused.
  void clear() {
    for (auto& s : kept_) free_.push_back(std::move(s));
    kept_.clear();
  }

 private:
  struct slot {
    std::uint64_t key = 0;
    std::tuple<Saved...> values;
  };

  /// A new free slot: what copies is copied (its sizes and settings carry over).
  [[gnu::noinline]] void add_free_slot(Saved const&... live);
  template <class T>
  static T fresh(T const& live) {
    if constexpr (detail::copies<T>::value)
      return live;
    else
      return T{};
  }
  static void swap_with(std::tuple<Saved...>& values, Saved&... live) {
    std::apply(
        [&](auto&... kept) {
          using std::swap;
          (swap(kept, live), ...);
        },
        values);
  }
  typename std::vector<slot>::iterator find(std::uint64_t key) {
    return std::find_if(kept_.begin(), kept_.end(), [&](slot const& s) { return s.key == key; });
  }

  std::vector<slot> kept_, free_;
};

template <class... Saved>
void activation_stash<Saved...>::park(std::uint64_t key, Saved&... live) {
  if (find(key) != kept_.end())
    throw input_error("activation_stash: micro-batch key " + std::to_string(key) +
                      " is set aside already (a forward without its backward)");
  if (free_.empty()) add_free_slot(live...);
  slot s = std::move(free_.back());
  free_.pop_back();
  swap_with(s.values, live...);
  s.key = key;
  kept_.push_back(std::move(s));
}

template <class... Saved>
void activation_stash<Saved...>::restore(std::uint64_t key, Saved&... live) {
  auto const at = find(key);
  if (at == kept_.end())
    throw input_error("activation_stash: nothing set aside for micro-batch key " +
                      std::to_string(key) + " (a backward without its forward)");
  swap_with(at->values, live...);
  free_.push_back(std::move(*at));
  kept_.erase(at);
}

template <class... Saved>
void activation_stash<Saved...>::add_free_slot(Saved const&... live) {
  free_.push_back({0, std::tuple<Saved...>(fresh(live)...)});
}

}  // namespace megamoe
