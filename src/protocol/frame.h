// Edge <-> agent framing. One stream socket carries many concurrent operations ("channels");
// every frame names its channel. Frames are bounded; the decoder rejects garbage (bad magic,
// unknown type, oversize length) with an error, after which the connection is dropped.
//
// Header, 12 bytes, little-endian:
//   u16 magic 0x5344 ("DS")  u8 type  u8 flags  u32 channel  u32 payload_length
// Used by both the edge (container backend) and dsec-agent.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace dsec::protocol {

inline constexpr uint16_t kMagic = 0x5344;
inline constexpr size_t kHeaderSize = 12;
inline constexpr uint32_t kMaxPayload = 1u << 20;  // 1 MiB
// Payload bytes per data frame the senders use (well under kMaxPayload).
inline constexpr size_t kDataChunk = 64 * 1024;

enum class FrameType : uint8_t {
  kHello = 1,     // agent -> edge: {"version", "pid"} first frame on every connection
  kAuth = 2,      // edge -> agent: {"secret"} on a reconnected (not inherited) connection
  kSetup = 3,     // edge -> agent: sandbox setup spec, with fds (SCM_RIGHTS)
  kReady = 4,     // agent -> edge: setup done, serving
  kRequest = 5,   // edge -> agent: {"op": ...} opens a channel
  kData = 6,      // both ways: stream bytes for a channel (flags: stream, EOF)
  kControl = 7,   // edge -> agent: {"signal"|"resize"|"kill"} for a channel
  kEvent = 8,     // agent -> edge: {"started"|"stdin_ack"} progress on a channel
  kResponse = 9,  // agent -> edge: final JSON result; closes the channel
  kLog = 10,      // agent -> edge: diagnostic line
  kError = 11,    // agent -> edge: fatal (setup failed, auth failed)
};
inline constexpr uint8_t kMaxFrameType = 11;

// kData flags.
enum Stream : uint8_t { kStdin = 0, kStdout = 1, kStderr = 2, kBody = 3 };
inline constexpr uint8_t kStreamMask = 0x03;
inline constexpr uint8_t kFlagEof = 0x80;

struct Frame {
  FrameType type = FrameType::kData;
  uint8_t flags = 0;
  uint32_t channel = 0;
  std::string payload;

  uint8_t stream() const { return flags & kStreamMask; }
  bool eof() const { return (flags & kFlagEof) != 0; }
};

// Appends the encoded frame to *out. Payload must be <= kMaxPayload.
Status EncodeFrame(FrameType type, uint8_t flags, uint32_t channel, std::string_view payload,
                   std::string* out);
std::string EncodeFrameOrDie(FrameType type, uint8_t flags, uint32_t channel,
                             std::string_view payload);

// Incremental decoder: feed bytes as they arrive, pop whole frames. Memory is bounded by one
// frame (header + kMaxPayload) plus whatever the caller fed in one call.
class FrameDecoder {
 public:
  explicit FrameDecoder(uint32_t max_payload = kMaxPayload) : max_payload_(max_payload) {}
  // Appends bytes; returns an error (and stays failed) on a malformed header.
  Status Feed(std::string_view data);
  // Moves the next complete frame into *f; false if none is complete yet.
  bool Next(Frame* f);
  bool failed() const { return !error_.ok(); }
  size_t buffered() const { return buf_.size() - pos_; }

 private:
  Status CheckHeader();
  uint32_t max_payload_;
  std::string buf_;
  size_t pos_ = 0;
  Status error_;
};

}  // namespace dsec::protocol
