#include "kv_transfer/descriptor.h"

#include <array>

namespace pdserve::kv_transfer {
namespace {

constexpr std::string_view kMagic = "PDKV";
constexpr std::uint8_t kVersion = 1;
// A worker address or a packed rkey is a few hundred bytes; anything far larger is corrupt.
constexpr std::uint32_t kMaxBlobBytes = 1u << 20;

void put_u64(std::string& out, std::uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

void put_blob(std::string& out, const std::vector<std::uint8_t>& blob) {
  const auto size = static_cast<std::uint32_t>(blob.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((size >> (8 * i)) & 0xff));
  out.append(blob.begin(), blob.end());
}

// Reads little-endian fields from a byte string, failing with the field's name.
class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}

  Result<std::uint64_t> u64(const char* field) {
    PDS_ASSIGN_OR_RETURN(std::string_view raw, take(8, field));
    std::uint64_t value = 0;
    for (int i = 0; i < 8; ++i)
      value |= std::uint64_t{static_cast<std::uint8_t>(raw[i])} << (8 * i);
    return value;
  }

  Result<std::vector<std::uint8_t>> blob(const char* field) {
    PDS_ASSIGN_OR_RETURN(std::string_view raw_size, take(4, field));
    std::uint32_t size = 0;
    for (int i = 0; i < 4; ++i)
      size |= std::uint32_t{static_cast<std::uint8_t>(raw_size[i])} << (8 * i);
    if (size == 0 || size > kMaxBlobBytes) {
      return data_loss("KV peer descriptor: " + std::string(field) + " has an implausible size " +
                       std::to_string(size));
    }
    PDS_ASSIGN_OR_RETURN(std::string_view raw, take(size, field));
    return std::vector<std::uint8_t>(raw.begin(), raw.end());
  }

  Result<std::string_view> take(std::size_t count, const char* field) {
    if (bytes_.size() - position_ < count) {
      return data_loss("KV peer descriptor truncated at byte " + std::to_string(position_) +
                       " while reading " + field);
    }
    std::string_view out = bytes_.substr(position_, count);
    position_ += count;
    return out;
  }

  bool at_end() const { return position_ == bytes_.size(); }
  std::size_t position() const { return position_; }

 private:
  std::string_view bytes_;
  std::size_t position_ = 0;
};

constexpr std::string_view kAlphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int base64_value(char c) {
  const auto pos = kAlphabet.find(c);
  return pos == std::string_view::npos ? -1 : static_cast<int>(pos);
}

}  // namespace

std::string serialize_descriptor(const PeerDescriptor& descriptor) {
  std::string out(kMagic);
  out.push_back(static_cast<char>(kVersion));
  put_u64(out, descriptor.pool_base);
  put_u64(out, descriptor.pool_bytes);
  put_blob(out, descriptor.worker_address);
  put_blob(out, descriptor.packed_rkey);
  return out;
}

Result<PeerDescriptor> parse_descriptor(std::string_view bytes) {
  Reader reader(bytes);
  PDS_ASSIGN_OR_RETURN(std::string_view magic, reader.take(kMagic.size(), "magic"));
  if (magic != kMagic) return invalid_argument("KV peer descriptor: bad magic (not a PDKV blob)");
  PDS_ASSIGN_OR_RETURN(std::string_view version, reader.take(1, "version"));
  if (static_cast<std::uint8_t>(version[0]) != kVersion) {
    return invalid_argument("KV peer descriptor: unsupported version " +
                            std::to_string(static_cast<std::uint8_t>(version[0])));
  }
  PeerDescriptor descriptor;
  PDS_ASSIGN_OR_RETURN(descriptor.pool_base, reader.u64("pool_base"));
  PDS_ASSIGN_OR_RETURN(descriptor.pool_bytes, reader.u64("pool_bytes"));
  PDS_ASSIGN_OR_RETURN(descriptor.worker_address, reader.blob("worker_address"));
  PDS_ASSIGN_OR_RETURN(descriptor.packed_rkey, reader.blob("packed_rkey"));
  if (!reader.at_end()) {
    return data_loss("KV peer descriptor: trailing bytes after byte " +
                     std::to_string(reader.position()));
  }
  if (descriptor.pool_bytes == 0 ||
      descriptor.pool_base + descriptor.pool_bytes < descriptor.pool_base) {
    return invalid_argument("KV peer descriptor: empty or wrapping pool extent");
  }
  return descriptor;
}

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const std::uint32_t group = std::uint32_t{static_cast<std::uint8_t>(bytes[i])} << 16 |
                                std::uint32_t{static_cast<std::uint8_t>(bytes[i + 1])} << 8 |
                                static_cast<std::uint8_t>(bytes[i + 2]);
    for (int shift = 18; shift >= 0; shift -= 6) out.push_back(kAlphabet[(group >> shift) & 63]);
  }
  const std::size_t rest = bytes.size() - i;
  if (rest > 0) {
    std::uint32_t group = std::uint32_t{static_cast<std::uint8_t>(bytes[i])} << 16;
    if (rest == 2) group |= std::uint32_t{static_cast<std::uint8_t>(bytes[i + 1])} << 8;
    out.push_back(kAlphabet[(group >> 18) & 63]);
    out.push_back(kAlphabet[(group >> 12) & 63]);
    out.push_back(rest == 2 ? kAlphabet[(group >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

Result<std::string> base64_decode(std::string_view text) {
  if (text.size() % 4 != 0) {
    return invalid_argument("base64: length " + std::to_string(text.size()) +
                            " is not a multiple of 4");
  }
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (std::size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    std::array<int, 4> values{};
    int padding = 0;
    for (int j = 0; j < 4; ++j) {
      const char c = text[i + j];
      if (c == '=' && last && j >= 2 && (j == 3 || text[i + 3] == '=')) {
        values[j] = 0;
        ++padding;
        continue;
      }
      values[j] = base64_value(c);
      if (values[j] < 0 || padding > 0) {
        return invalid_argument("base64: invalid character at position " + std::to_string(i + j));
      }
    }
    const std::uint32_t group =
        static_cast<std::uint32_t>(values[0]) << 18 | static_cast<std::uint32_t>(values[1]) << 12 |
        static_cast<std::uint32_t>(values[2]) << 6 | static_cast<std::uint32_t>(values[3]);
    out.push_back(static_cast<char>((group >> 16) & 0xff));
    if (padding < 2) out.push_back(static_cast<char>((group >> 8) & 0xff));
    if (padding < 1) out.push_back(static_cast<char>(group & 0xff));
  }
  return out;
}

}  // namespace pdserve::kv_transfer
