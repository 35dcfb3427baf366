#include "kv_transfer/send_staging.h"

#include <algorithm>
#include <string>

namespace pdserve::kv_transfer {

Result<std::unique_ptr<SendStaging>> SendStaging::create(PoolCopier& copier, std::byte* ring,
                                                         std::uint64_t ring_offset,
                                                         std::uint64_t ring_bytes,
                                                         std::uint64_t unit) {
  if (unit == 0 || ring == nullptr || ring_bytes < 2 * unit) {
    return invalid_argument("KV staging: a send ring of " + std::to_string(ring_bytes) +
                            " bytes holds fewer than two buffers of one layer's block (" +
                            std::to_string(unit) + " bytes)");
  }
  const std::uint64_t slot_bytes = std::min(kMaxSlotBytes, ring_bytes / 2) / unit * unit;
  const auto num_slots = static_cast<int>(ring_bytes / std::max(slot_bytes, unit));
  return std::unique_ptr<SendStaging>(
      new SendStaging(copier, ring, ring_offset, num_slots, std::max(slot_bytes, unit), unit));
}

Status SendStaging::enqueue(std::uint64_t stream, std::span<const BlockCopy> copies) {
  for (const BlockCopy& copy : copies) {
    if (copy.bytes == 0 || copy.bytes % unit_ != 0) {
      return invalid_argument("KV staging: a put of " + std::to_string(copy.bytes) +
                              " bytes is not whole layer-block halves of " + std::to_string(unit_) +
                              " bytes");
    }
  }
  Order& order = orders_[stream];
  for (const BlockCopy& copy : copies) {
    for (std::uint64_t done = 0; done < copy.bytes; done += slot_bytes_) {
      const std::uint64_t bytes = std::min(slot_bytes_, copy.bytes - done);
      queue_.push_back({stream, {copy.local_offset + done, copy.remote_offset + done, bytes, 0}});
      ++order.queued;
    }
  }
  return Status::ok_status();
}

void SendStaging::fill(int slot_index, std::vector<std::pair<std::uint64_t, Status>>& failed) {
  Slot& slot = slots_[static_cast<std::size_t>(slot_index)];
  const std::uint64_t stream = queue_.front().stream;
  Order& order = orders_[stream];
  slot.segments.clear();
  std::vector<PoolCopy> copies;
  std::uint64_t used = 0;
  std::byte* base = ring_ + static_cast<std::uint64_t>(slot_index) * slot_bytes_;
  while (!queue_.empty() && queue_.front().stream == stream &&
         used + queue_.front().segment.bytes <= slot_bytes_) {
    Segment segment = queue_.front().segment;
    queue_.pop_front();
    --order.queued;
    segment.slot_offset = used;
    // Segments land back to back in the slot, so pool-contiguous ones are one copy (runs that
    // are consecutive here but not in the peer's pool are separate puts).
    if (!copies.empty() && copies.back().pool_offset + copies.back().bytes == segment.pool_offset) {
      copies.back().bytes += segment.bytes;
    } else {
      copies.push_back({segment.pool_offset, base + used, segment.bytes});
    }
    slot.segments.push_back(segment);
    used += segment.bytes;
  }
  Result<CopyBatchId> batch = copier_.start(CopyDirection::kToHost, copies);
  if (!batch.ok()) {
    slot.segments.clear();
    fail(stream, batch.status().with_context("KV staging: copying from the pool"), failed);
    return;
  }
  slot.state = SlotState::kFilling;
  slot.stream = stream;
  slot.sequence = order.next_fill++;
  slot.batch = *batch;
  slot.dropped = false;
}

std::vector<SendStaging::Filled> SendStaging::advance(
    std::vector<std::pair<std::uint64_t, Status>>& failed) {
  for (int i = 0; i < num_slots() && !queue_.empty(); ++i) {
    if (slots_[static_cast<std::size_t>(i)].state == SlotState::kFree) fill(i, failed);
  }
  for (Slot& slot : slots_) {
    if (slot.state != SlotState::kFilling) continue;
    Result<bool> done = copier_.finished(slot.batch);
    if (done.ok() && !*done) continue;
    const bool dropped = slot.dropped;
    const std::uint64_t stream = slot.stream;
    slot.state = SlotState::kFilled;
    if (dropped || !done.ok()) {
      slot.state = SlotState::kFree;
      slot.segments.clear();
    }
    if (!done.ok() && !dropped) {
      fail(stream, done.status().with_context("KV staging: copying from the pool"), failed);
    }
  }
  std::vector<Filled> out;
  for (auto& [stream, order] : orders_) {
    for (bool found = true; found;) {
      found = false;
      for (std::size_t i = 0; i < slots_.size(); ++i) {
        Slot& slot = slots_[i];
        if (slot.state != SlotState::kFilled || slot.stream != stream ||
            slot.sequence != order.next_out) {
          continue;
        }
        slot.state = SlotState::kHandedOut;
        ++order.next_out;
        out.push_back({stream, static_cast<int>(i), std::move(slot.segments)});
        slot.segments.clear();
        found = true;
      }
    }
  }
  return out;
}

void SendStaging::fail(std::uint64_t stream, Status why,
                       std::vector<std::pair<std::uint64_t, Status>>& failed) {
  failed.emplace_back(stream, std::move(why));
  drop(stream);
}

void SendStaging::release(int slot) {
  Slot& released = slots_[static_cast<std::size_t>(slot)];
  PDS_CHECK(released.state == SlotState::kHandedOut,
            "KV staging: slot " + std::to_string(slot) + " released but not handed out");
  released.state = SlotState::kFree;
}

void SendStaging::drop(std::uint64_t stream) {
  std::erase_if(queue_, [&](const Queued& queued) { return queued.stream == stream; });
  for (Slot& slot : slots_) {
    if (slot.stream != stream) continue;
    if (slot.state == SlotState::kFilled) {
      slot.state = SlotState::kFree;
      slot.segments.clear();
    } else if (slot.state == SlotState::kFilling) {
      slot.dropped = true;
    }
  }
  orders_.erase(stream);
}

bool SendStaging::idle(std::uint64_t stream) const {
  if (waiting_for_slot(stream)) return false;
  return std::none_of(slots_.begin(), slots_.end(), [&](const Slot& slot) {
    return slot.stream == stream && !slot.dropped &&
           (slot.state == SlotState::kFilling || slot.state == SlotState::kFilled);
  });
}

bool SendStaging::waiting_for_slot(std::uint64_t stream) const {
  auto it = orders_.find(stream);
  return it != orders_.end() && it->second.queued > 0;
}

int SendStaging::filling() const {
  return static_cast<int>(std::count_if(slots_.begin(), slots_.end(), [](const Slot& slot) {
    return slot.state == SlotState::kFilling;
  }));
}

int SendStaging::free_slots() const {
  return static_cast<int>(std::count_if(slots_.begin(), slots_.end(), [](const Slot& slot) {
    return slot.state == SlotState::kFree;
  }));
}

}  // namespace pdserve::kv_transfer
