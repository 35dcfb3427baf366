#include "common/tokenizer/tokenizer_files.h"

#include <openssl/evp.h>

#include <array>
#include <system_error>

#include "common/core/files.h"

namespace pdserve {

Result<TokenizerFiles> TokenizerFiles::read(const std::filesystem::path& dir) {
  TokenizerFiles files;
  PDS_ASSIGN_OR_RETURN(files.tokenizer_json, read_text_file(dir / "tokenizer.json"));
  const std::filesystem::path config = dir / "tokenizer_config.json";
  std::error_code error;
  if (std::filesystem::exists(config, error)) {
    PDS_ASSIGN_OR_RETURN(files.tokenizer_config_json, read_text_file(config));
  }
  return files;
}

Status TokenizerFiles::write(const std::filesystem::path& dir) const {
  PDS_RETURN_IF_ERROR(write_file(dir / "tokenizer.json", tokenizer_json));
  if (tokenizer_config_json.empty()) return {};
  return write_file(dir / "tokenizer_config.json", tokenizer_config_json);
}

std::string TokenizerFiles::sha256() const {
  return sha256_hex(sha256_hex(tokenizer_json) + "\n" + sha256_hex(tokenizer_config_json));
}

nlohmann::json TokenizerFiles::to_json() const {
  return {{"tokenizer_json", tokenizer_json}, {"tokenizer_config_json", tokenizer_config_json}};
}

Result<TokenizerFiles> TokenizerFiles::parse(const nlohmann::json& json) {
  if (!json.is_object()) return invalid_argument("tokenizer files: not a JSON object");
  TokenizerFiles files;
  for (const auto& [field, target] :
       {std::pair{"tokenizer_json", &files.tokenizer_json},
        std::pair{"tokenizer_config_json", &files.tokenizer_config_json}}) {
    const auto found = json.find(field);
    if (found == json.end() || !found->is_string()) {
      return invalid_argument(std::string("tokenizer files: '") + field + "' must be a string");
    }
    *target = found->get<std::string>();
  }
  if (files.tokenizer_json.empty()) return invalid_argument("tokenizer files: no tokenizer_json");
  return files;
}

std::string sha256_hex(std::string_view bytes) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int size = 0;
  // EVP_Digest fails only when OpenSSL cannot allocate; an empty identity then matches nothing.
  if (EVP_Digest(bytes.data(), bytes.size(), digest.data(), &size, EVP_sha256(), nullptr) != 1) {
    return {};
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(size * 2);
  for (unsigned int i = 0; i < size; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 0xf]);
  }
  return hex;
}

bool is_sha256_hex(std::string_view text) {
  if (text.size() != 64) return false;
  for (const char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace pdserve
