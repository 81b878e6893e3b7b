#include "protocol/frame.h"

#include <cstdlib>
#include <cstring>

namespace dsec::protocol {

namespace {
void PutU16(std::string* out, uint16_t v) {
  out->push_back(static_cast<char>(v & 0xff));
  out->push_back(static_cast<char>(v >> 8));
}
void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint32_t GetU32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}
}  // namespace

Status EncodeFrame(FrameType type, uint8_t flags, uint32_t channel, std::string_view payload,
                   std::string* out) {
  if (payload.size() > kMaxPayload)
    return TooLarge("frame payload of " + std::to_string(payload.size()) + " bytes exceeds " +
                    std::to_string(kMaxPayload));
  out->reserve(out->size() + kHeaderSize + payload.size());
  PutU16(out, kMagic);
  out->push_back(static_cast<char>(type));
  out->push_back(static_cast<char>(flags));
  PutU32(out, channel);
  PutU32(out, static_cast<uint32_t>(payload.size()));
  out->append(payload);
  return OkStatus();
}

std::string EncodeFrameOrDie(FrameType type, uint8_t flags, uint32_t channel,
                             std::string_view payload) {
  std::string out;
  if (!EncodeFrame(type, flags, channel, payload, &out).ok()) abort();
  return out;
}

Status FrameDecoder::Feed(std::string_view data) {
  if (!error_.ok()) return error_;
  if (pos_ > 0 && pos_ >= buf_.size() / 2) {  // compact consumed prefix
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  buf_.append(data);
  return CheckHeader();
}

Status FrameDecoder::CheckHeader() {
  if (buf_.size() - pos_ < kHeaderSize) return OkStatus();
  const auto* p = reinterpret_cast<const unsigned char*>(buf_.data() + pos_);
  uint16_t magic = static_cast<uint16_t>(p[0] | p[1] << 8);
  uint8_t type = p[2];
  uint32_t len = GetU32(p + 8);
  if (magic != kMagic) {
    error_ = InvalidArgument("protocol: bad frame magic");
  } else if (type == 0 || type > kMaxFrameType) {
    error_ = InvalidArgument("protocol: unknown frame type " + std::to_string(type));
  } else if (len > max_payload_) {
    error_ = TooLarge("protocol: frame payload " + std::to_string(len) + " exceeds " +
                      std::to_string(max_payload_));
  }
  return error_;
}

bool FrameDecoder::Next(Frame* f) {
  if (!error_.ok() || buf_.size() - pos_ < kHeaderSize) return false;
  const auto* p = reinterpret_cast<const unsigned char*>(buf_.data() + pos_);
  uint32_t len = GetU32(p + 8);
  if (buf_.size() - pos_ < kHeaderSize + len) return false;
  f->type = static_cast<FrameType>(p[2]);
  f->flags = p[3];
  f->channel = GetU32(p + 4);
  f->payload.assign(buf_.data() + pos_ + kHeaderSize, len);
  pos_ += kHeaderSize + len;
  if (pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  }
  // Validate the following header now so a garbage stream fails as early as possible.
  (void)CheckHeader();
  return true;
}

}  // namespace dsec::protocol
