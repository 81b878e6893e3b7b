// Runs a libFuzzer entry point without libFuzzer (gcc builds, the sanitizer build): every seed
// file of a corpus directory, then mutations of them (deterministic seed): byte flips,
// inserts, erases, truncations, splices of two seeds and random bytes. A crash, a sanitizer
// report or a trap fails the test.
//
//   <target>_fuzz_driver ITERATIONS SEED_DIR
#include <dirent.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::vector<std::string> ReadSeeds(const char* dir) {
  std::vector<std::string> seeds;
  DIR* d = opendir(dir);
  if (!d) return seeds;
  std::vector<std::string> names;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') names.emplace_back(e->d_name);
  closedir(d);
  std::sort(names.begin(), names.end());  // the same order on every run
  for (const auto& n : names) {
    std::ifstream f(std::string(dir) + "/" + n, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    seeds.push_back(ss.str());
  }
  return seeds;
}

void Run(const std::string& in) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(in.data()), in.size());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s ITERATIONS SEED_DIR\n", argv[0]);
    return 2;
  }
  int iterations = atoi(argv[1]);
  std::vector<std::string> seeds = ReadSeeds(argv[2]);
  if (seeds.empty()) {
    fprintf(stderr, "%s: no seed files in %s\n", argv[0], argv[2]);
    return 2;
  }
  for (const auto& s : seeds) Run(s);
  std::mt19937 rng(12345);
  for (int i = 0; i < iterations; ++i) {
    std::string in = seeds[rng() % seeds.size()];
    int mutations = 1 + static_cast<int>(rng() % 8);
    for (int m = 0; m < mutations; ++m) {
      switch (rng() % 6) {
        case 0:
          if (!in.empty()) in[rng() % in.size()] = static_cast<char>(rng());
          break;
        case 1:
          in.insert(rng() % (in.size() + 1), 1, static_cast<char>(rng()));
          break;
        case 2:
          if (!in.empty()) in.erase(rng() % in.size(), 1 + rng() % 16);
          break;
        case 3: {  // splice: a piece of another seed at a random place
          const std::string& o = seeds[rng() % seeds.size()];
          size_t from = o.empty() ? 0 : rng() % o.size();
          in.insert(rng() % (in.size() + 1), o.substr(from, 1 + rng() % 64));
          break;
        }
        case 4:  // a byte that parsers treat specially
          if (!in.empty()) in[rng() % in.size()] = "\r\n\0:%/ .\xff"[rng() % 10];
          break;
        default:
          in.resize(rng() % (in.size() + 1));
      }
    }
    if (i % 7 == 0) {
      in.resize(rng() % 1024);
      for (auto& c : in) c = static_cast<char>(rng());
    }
    Run(in);
  }
  printf("ran %d inputs (%zu seeds)\n", iterations + static_cast<int>(seeds.size()), seeds.size());
  return 0;
}
