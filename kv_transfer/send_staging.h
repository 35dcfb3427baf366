// The send side of the staging path (issue #14): a ring of bounce buffers ("slots") in the
// registered host staging area. A stream's puts arrive as pool ranges; they are cut into
// pieces of at most a slot (at layer-block-half boundaries, `unit`) and packed into slots in
// arrival order, one stream per slot. A slot is filled from the pool by the PoolCopier (one
// batch per slot), handed out once filled, in its stream's order, for its puts, and is free
// again when UCX reads it no more (release()). So the memory is the ring and nothing else, a
// stream waits for a free slot (its transfer's deadline bounds the wait), and with two slots
// or more one fills while another's puts go out (double buffering, or deeper).
//
// Single-threaded: the transfer thread (kv_transfer_service.cpp) drives it.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "common/core/status.h"
#include "kv_transfer/kv_transfer_engine.h"
#include "kv_transfer/pool_copier.h"

namespace pdserve::kv_transfer {

class SendStaging {
 public:
  struct Segment {
    std::uint64_t pool_offset = 0;
    std::uint64_t remote_offset = 0;
    std::uint64_t bytes = 0;
    std::uint64_t slot_offset = 0;  // where it lies in its slot
  };
  // A slot whose copy from the pool has finished: its segments' puts may go.
  struct Filled {
    std::uint64_t stream = 0;
    int slot = 0;
    std::vector<Segment> segments;
  };

  // The ring is `ring_bytes` at `ring`, which lies at `ring_offset` in the registered region:
  // as many slots as fit, each at most kMaxSlotBytes and a multiple of `unit`, at least two.
  // InvalidArgument when two slots of one unit do not fit.
  static Result<std::unique_ptr<SendStaging>> create(PoolCopier& copier, std::byte* ring,
                                                     std::uint64_t ring_offset,
                                                     std::uint64_t ring_bytes, std::uint64_t unit);

  static constexpr std::uint64_t kMaxSlotBytes = std::uint64_t{8} << 20;

  // Queues `copies` of `stream`, their local offsets being pool offsets. InvalidArgument, and
  // nothing queued, for a copy that is empty or not whole units.
  Status enqueue(std::uint64_t stream, std::span<const BlockCopy> copies);
  // Starts filling free slots with queued segments (first come, first served), collects the
  // fills that finished, and returns those that are next in their stream's order. A copy that
  // fails fails its stream: it is listed in `failed` and dropped.
  std::vector<Filled> advance(std::vector<std::pair<std::uint64_t, Status>>& failed);
  // The puts of a handed-out slot read it no more.
  void release(int slot);
  // Forgets a stream: its queued segments and filled slots are dropped at once, the slots
  // still being filled once their copy has finished (the copier writes them until then).
  void drop(std::uint64_t stream);
  // Nothing of the stream is queued, being filled, or filled and not yet handed out.
  bool idle(std::uint64_t stream) const;
  // Some of the stream's segments wait for a free slot.
  bool waiting_for_slot(std::uint64_t stream) const;
  // Slots being filled (the copier may still write them).
  int filling() const;

  const std::byte* slot_data(int slot) const {
    return ring_ + static_cast<std::uint64_t>(slot) * slot_bytes_;
  }
  std::uint64_t slot_region_offset(int slot) const {
    return ring_offset_ + static_cast<std::uint64_t>(slot) * slot_bytes_;
  }
  int num_slots() const { return static_cast<int>(slots_.size()); }
  std::uint64_t slot_bytes() const { return slot_bytes_; }
  int free_slots() const;

 private:
  enum class SlotState { kFree, kFilling, kFilled, kHandedOut };
  struct Slot {
    SlotState state = SlotState::kFree;
    std::uint64_t stream = 0;
    std::uint64_t sequence = 0;  // its place in its stream's order
    CopyBatchId batch = 0;
    bool dropped = false;  // its stream was dropped while it filled
    std::vector<Segment> segments;
  };
  struct Queued {
    std::uint64_t stream = 0;
    Segment segment;
  };
  struct Order {
    std::uint64_t next_fill = 0;  // sequence of the stream's next slot
    std::uint64_t next_out = 0;   // sequence of the next slot to hand out
    std::size_t queued = 0;       // its segments in the queue
  };

  SendStaging(PoolCopier& copier, std::byte* ring, std::uint64_t ring_offset, int num_slots,
              std::uint64_t slot_bytes, std::uint64_t unit)
      : copier_(copier),
        ring_(ring),
        ring_offset_(ring_offset),
        slot_bytes_(slot_bytes),
        unit_(unit),
        slots_(static_cast<std::size_t>(num_slots)) {}
  // Fills `slot` with the queue's first segments (of one stream).
  void fill(int slot, std::vector<std::pair<std::uint64_t, Status>>& failed);
  void fail(std::uint64_t stream, Status why,
            std::vector<std::pair<std::uint64_t, Status>>& failed);

  PoolCopier& copier_;
  std::byte* ring_;
  std::uint64_t ring_offset_;
  std::uint64_t slot_bytes_;
  std::uint64_t unit_;
  std::vector<Slot> slots_;
  std::deque<Queued> queue_;
  std::map<std::uint64_t, Order> orders_;  // streams with work here
};

}  // namespace pdserve::kv_transfer
