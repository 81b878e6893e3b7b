// libFuzzer target for everything an agent or edge parses off the wire: the frame decoder
// (fed in arbitrary chunks) and the JSON message parsers. Built by the "asan" preset with
// clang (-fsanitize=fuzzer,address,undefined); the regular build runs the same entry point
// with the generic driver (src/base/fuzz_driver.cc) over tests/testdata/fuzz/protocol.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "protocol/agent_ops.h"
#include "protocol/frame.h"
#include "protocol/messages.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dsec::protocol;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  // The first byte picks the chunking so split headers and payloads get exercised.
  size_t chunk = size ? (static_cast<uint8_t>(in[0]) % 64) + 1 : 1;
  FrameDecoder dec(64 * 1024);
  Frame f;
  for (size_t off = 0; off < size; off += chunk) {
    if (!dec.Feed(in.substr(off, chunk)).ok()) break;
    while (dec.Next(&f)) {
      if (f.payload.size() > 64 * 1024) __builtin_trap();  // the bound must hold
      auto j = ParseJson(f.payload);
      if (!j.ok()) continue;
      (void)SetupSpecFromJson(*j);
      (void)ExecSpecFromJson(*j);
      (void)ExecResultFromJson(*j);
      (void)FileEntryFromJson(*j);
      (void)StatusFromJson(*j);
      // Every typed request and response (agent_ops.h).
      (void)DecodeAs<Hello>(*j);
      (void)DecodeAs<ShellRunRequest>(*j);
      (void)DecodeAs<ShellRunResponse>(*j);
      (void)DecodeAs<SignalAllRequest>(*j);
      (void)DecodeAs<ReadFileRequest>(*j);
      (void)DecodeAs<WriteFileRequest>(*j);
      (void)DecodeAs<ListDirRequest>(*j);
      (void)DecodeAs<ListDirResponse>(*j);
      (void)DecodeAs<StatRequest>(*j);
      (void)DecodeAs<WatchDirRequest>(*j);
      (void)DecodeAs<CaptureLayerRequest>(*j);
      (void)WatchEventFromJson(*j);
      (void)DecodeAs<StatResponse>(*j);
      (void)DecodeAs<MakeDirRequest>(*j);
      (void)DecodeAs<RemoveRequest>(*j);
      (void)DecodeAs<TarExtractRequest>(*j);
      (void)DecodeAs<TarCreateRequest>(*j);
    }
  }
  return 0;
}
