// Runs the fuzz entry point without libFuzzer: valid frames, mutations of them and random
// bytes (deterministic seed). A crash, a sanitizer report or a trap fails the test.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "protocol/frame.h"
#include "protocol/messages.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  using namespace dsec::protocol;
  int iterations = argc > 1 ? atoi(argv[1]) : 20000;
  std::vector<std::string> seeds;
  ExecSpec e;
  e.argv = {"python3", "-c", "print(1)"};
  e.env = {"A=b"};
  SetupSpec s;
  s.sandbox_id = "sb-x";
  s.rootfs.overlays.push_back({"/usr", {0}});
  for (const std::string& payload :
       {ToJson(e).dump(), ToJson(s).dump(), ToJson(ExecResult{}).dump(),
        std::string(R"({"error":{"code":"not_found","message":"x"}})"), std::string("{}"),
        std::string("[1,2,3]")}) {
    std::string f = "\x05";  // chunking byte
    f += EncodeFrameOrDie(FrameType::kRequest, 0, 1, payload);
    f += EncodeFrameOrDie(FrameType::kData, kStdout | kFlagEof, 1, "data");
    seeds.push_back(f);
  }
  if (argc > 2) {  // fuzz_driver N DIR: also write the seeds as a libFuzzer corpus
    for (size_t i = 0; i < seeds.size(); ++i) {
      std::string path = std::string(argv[2]) + "/seed-" + std::to_string(i);
      FILE* f = fopen(path.c_str(), "wb");
      if (!f) return 1;
      fwrite(seeds[i].data(), 1, seeds[i].size(), f);
      fclose(f);
    }
  }
  std::mt19937 rng(12345);
  for (const auto& seed : seeds)
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(seed.data()), seed.size());
  for (int i = 0; i < iterations; ++i) {
    std::string in = seeds[rng() % seeds.size()];
    int mutations = 1 + static_cast<int>(rng() % 8);
    for (int m = 0; m < mutations; ++m) {
      switch (rng() % 4) {
        case 0:
          if (!in.empty()) in[rng() % in.size()] = static_cast<char>(rng());
          break;
        case 1:
          in.insert(rng() % (in.size() + 1), 1, static_cast<char>(rng()));
          break;
        case 2:
          if (!in.empty()) in.erase(rng() % in.size(), 1 + rng() % 16);
          break;
        default:
          in.resize(rng() % (in.size() + 1));
      }
    }
    if (i % 5 == 0) {
      in.resize(rng() % 512);
      for (auto& c : in) c = static_cast<char>(rng());
    }
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(in.data()), in.size());
  }
  printf("ran %d inputs\n", iterations + static_cast<int>(seeds.size()));
  return 0;
}
