// SPDX-License-Identifier: Apache-2.0
// megamoe/parallel/collectives.ipp — the definitions behind collectives.hpp that depend on no
// configuration (compiled once under MEGAMOE_SEPARATE_COMPILATION; core/compiled_once.hpp).
#pragma once

#include <megamoe/parallel/collectives.hpp>
#include <megamoe/parallel/wait_clock.hpp>

#include <chrono>

namespace megamoe::parallel {

MEGAMOE_DECL void communicator_sum::sum(std::span<double> values) const {
  if (values.empty() || size() == 1) return;
  watched_collective const watch(MPI_Comm(*comm_), "sum", std::ssize(values));
  MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, MPI_SUM,
                MPI_Comm(*comm_));
}

MEGAMOE_DECL void communicator_max::operator()(std::span<float> values) const {
  if (values.empty() || comm_ == nullptr || comm_->size() == 1) return;
  watched_collective const watch(MPI_Comm(*comm_), "max", std::ssize(values));
  MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_FLOAT, MPI_MAX,
                MPI_Comm(*comm_));
}

MEGAMOE_DECL void element_layout::assign(std::span<std::int64_t const> rows, int width) {
  counts.resize(rows.size());
  displs.resize(rows.size());
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    std::int64_t const n = rows[i] * width;
    if (rows[i] < 0) throw input_error("collective: negative row count " + std::to_string(rows[i]));
    if (n > INT_MAX || offset > INT_MAX)
      throw input_error("collective: " + std::to_string(offset + n) +
                        " elements exceed what one MPI call can address");
    counts[i] = static_cast<int>(n);
    displs[i] = static_cast<int>(offset);
    offset += n;
  }
}

MEGAMOE_DECL request& request::operator=(request&& other) noexcept {
  if (this != &other) {
    wait();
    handle_ = std::exchange(other.handle_, MPI_REQUEST_NULL);
    watched_ = std::exchange(other.watched_, 0);
    send_ = std::move(other.send_);
    recv_ = std::move(other.recv_);
  }
  return *this;
}

MEGAMOE_DECL void request::wait() {
  if (handle_ != MPI_REQUEST_NULL) {
    if (wait_clock::on()) {
      auto const start = std::chrono::steady_clock::now();
      MPI_Wait(&handle_, MPI_STATUS_IGNORE);
      wait_clock::add(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    } else {
      MPI_Wait(&handle_, MPI_STATUS_IGNORE);
    }
  }
  // Its time in flight overlapped other work: only the wait above counts.
  wait_clock::close(watched_, false);
  watchdog::instance().end(std::exchange(watched_, 0));
}

MEGAMOE_DECL bool request::done() {
  if (handle_ != MPI_REQUEST_NULL) {
    int flag = 0;
    MPI_Test(&handle_, &flag, MPI_STATUS_IGNORE);
    if (flag == 0) return false;
  }
  wait_clock::close(watched_, false);
  watchdog::instance().end(std::exchange(watched_, 0));
  return true;
}

namespace detail {

MEGAMOE_DECL void require_size(std::size_t have, std::int64_t need, char const* what) {
  if (static_cast<std::int64_t>(have) < need)
    throw input_error(std::string("collective: ") + what + " holds " + std::to_string(have) +
                      " elements, the counts need " + std::to_string(need));
}

}  // namespace detail

MEGAMOE_DECL datatype::datatype(MPI_Datatype created) : type_(created) {
  MPI_Type_commit(&type_);
}

MEGAMOE_DECL datatype& datatype::operator=(datatype&& other) noexcept {
  if (this != &other) {
    reset();
    type_ = std::exchange(other.type_, MPI_DATATYPE_NULL);
  }
  return *this;
}

MEGAMOE_DECL void datatype::reset() {
  if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
}

MEGAMOE_DECL void typed_side::resize(std::size_t peers) {
  counts.assign(peers, 0);
  byte_offsets.assign(peers, 0);
  types.assign(peers, MPI_BYTE);
}

MEGAMOE_DECL request all_to_all_w_start(boost::mpi::communicator const& comm, void const* send,
                                        typed_side const& send_side, void* recv,
                                        typed_side const& recv_side) {
  request r;
  std::int64_t elements = 0;
  for (int c : send_side.counts) elements += c;
  watched_collective record(detail::raw(comm), "all_to_all_w", elements);
  std::int64_t bytes = 0;
  for (int j = 0; j < comm.size(); ++j) {
    auto const jj = static_cast<std::size_t>(j);
    if (j == comm.rank() || send_side.counts[jj] == 0) continue;
    int type_bytes = 0;
    MPI_Type_size(send_side.types[jj], &type_bytes);
    bytes += std::int64_t(send_side.counts[jj]) * type_bytes;
  }
  detail::count_traffic(comm, bytes);
  MPI_Ialltoallw(send, send_side.counts.data(), send_side.byte_offsets.data(),
                 send_side.types.data(), recv, recv_side.counts.data(),
                 recv_side.byte_offsets.data(), recv_side.types.data(), detail::raw(comm),
                 &r.handle_);
  r.watch(std::move(record));
  return r;
}

}  // namespace megamoe::parallel
