// Decoder (images/import.h): gzip (any number of members), zstd, or raw, chosen by the stream's
// first bytes, decompressed as it arrives.
#include <zlib.h>
#include <zstd.h>

#include <cstring>

#include "images/import.h"

namespace dsec::images {

namespace {
// Output buffer of one inflate/decompress call.
constexpr size_t kDecodeChunk = 256 * 1024;
}  // namespace

struct Decoder::Impl {
  enum class Kind { kUnknown, kRaw, kGzip, kZstd };
  Sink sink;
  Kind kind = Kind::kUnknown;
  std::string head;  // first bytes, until the kind is known
  z_stream zs{};
  bool z_init = false, z_ended = false;
  ZSTD_DCtx* zd = nullptr;
  size_t zstd_last = 0;
  std::vector<char> out = std::vector<char>(kDecodeChunk);

  ~Impl() {
    if (z_init) inflateEnd(&zs);
    if (zd) ZSTD_freeDCtx(zd);
  }

  static bool IsGzip(std::string_view h) {
    return h.size() >= 2 && static_cast<unsigned char>(h[0]) == 0x1f &&
           static_cast<unsigned char>(h[1]) == 0x8b;
  }
  static bool IsZstd(std::string_view h) { return h.substr(0, 4) == "\x28\xb5\x2f\xfd"; }

  Status Pick() {
    if (IsGzip(head)) {
      kind = Kind::kGzip;
      if (inflateInit2(&zs, 15 + 16) != Z_OK) return InternalError("zlib init failed");
      z_init = true;
    } else if (IsZstd(head)) {
      kind = Kind::kZstd;
      zd = ZSTD_createDCtx();
      if (!zd) return InternalError("zstd init failed");
    } else {
      kind = Kind::kRaw;
    }
    std::string h = std::move(head);
    head.clear();
    return Push(h);
  }

  Status Push(std::string_view in) {
    switch (kind) {
      case Kind::kUnknown:
        return OkStatus();
      case Kind::kRaw:
        return in.empty() ? OkStatus() : sink(in);
      case Kind::kGzip:
        while (!in.empty()) {
          if (z_ended) {  // another gzip member follows
            if (inflateReset(&zs) != Z_OK) return InternalError("zlib reset failed");
            z_ended = false;
          }
          zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
          zs.avail_in = static_cast<uInt>(std::min<size_t>(in.size(), 1u << 30));
          size_t given = zs.avail_in;
          do {
            zs.next_out = reinterpret_cast<Bytef*>(out.data());
            zs.avail_out = static_cast<uInt>(out.size());
            int r = inflate(&zs, Z_NO_FLUSH);
            if (r != Z_OK && r != Z_STREAM_END && r != Z_BUF_ERROR)
              return InvalidArgument(std::string("gzip: ") + (zs.msg ? zs.msg : "corrupt data"));
            size_t produced = out.size() - zs.avail_out;
            if (produced) DSEC_RETURN_IF_ERROR(sink(std::string_view(out.data(), produced)));
            if (r == Z_STREAM_END) {
              z_ended = true;
              break;
            }
            if (r == Z_BUF_ERROR && produced == 0) break;
          } while (zs.avail_in > 0 || zs.avail_out == 0);
          in.remove_prefix(given - zs.avail_in);
        }
        return OkStatus();
      case Kind::kZstd: {
        if (in.empty()) return OkStatus();
        ZSTD_inBuffer ib{in.data(), in.size(), 0};
        bool full = false;
        do {  // until the input is used up and the decoder holds nothing back
          ZSTD_outBuffer ob{out.data(), out.size(), 0};
          size_t r = ZSTD_decompressStream(zd, &ob, &ib);
          if (ZSTD_isError(r)) return InvalidArgument(std::string("zstd: ") + ZSTD_getErrorName(r));
          zstd_last = r;
          if (ob.pos) DSEC_RETURN_IF_ERROR(sink(std::string_view(out.data(), ob.pos)));
          full = ob.pos == ob.size;
        } while (ib.pos < ib.size || full);
        return OkStatus();
      }
    }
    return OkStatus();
  }
};

Decoder::Decoder(Sink sink) : impl_(std::make_unique<Impl>()) { impl_->sink = std::move(sink); }
Decoder::~Decoder() = default;

Status Decoder::Feed(std::string_view in) {
  if (impl_->kind == Impl::Kind::kUnknown) {
    size_t take = std::min(in.size(), 4 - impl_->head.size());
    impl_->head.append(in.substr(0, take));
    in.remove_prefix(take);
    if (impl_->head.size() < 4) return OkStatus();
    DSEC_RETURN_IF_ERROR(impl_->Pick());
  }
  return impl_->Push(in);
}

Status Decoder::Finish() {
  if (impl_->kind == Impl::Kind::kUnknown) DSEC_RETURN_IF_ERROR(impl_->Pick());
  if (impl_->kind == Impl::Kind::kGzip && !impl_->z_ended)
    return InvalidArgument("gzip: the stream ends early");
  if (impl_->kind == Impl::Kind::kZstd && impl_->zstd_last != 0)
    return InvalidArgument("zstd: the stream ends early");
  return OkStatus();
}

bool Decoder::Compressed(std::string_view head) { return Impl::IsGzip(head) || Impl::IsZstd(head); }

const char* Decoder::kind() const {
  switch (impl_->kind) {
    case Impl::Kind::kGzip:
      return "gzip";
    case Impl::Kind::kZstd:
      return "zstd";
    case Impl::Kind::kRaw:
      return "raw";
    default:
      return "unknown";
  }
}

}  // namespace dsec::images
