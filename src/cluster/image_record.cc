#include "cluster/image_record.h"

#include <algorithm>

#include "base/strings.h"

namespace dsec::cluster {

namespace {

bool IsDigest(const std::string& d) {
  if (d.size() != 7 + 64 || d.compare(0, 7, "sha256:") != 0) return false;
  return std::all_of(d.begin() + 7, d.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

}  // namespace

Json ClusterImage::ToJson() const {
  Json ls = Json::array();
  for (const auto& l : layers)
    ls.push_back(
        {{"digest", l.digest}, {"size", l.size}, {"blob", l.blob}, {"blob_size", l.blob_size}});
  return {{"name", name},
          {"project", project},
          {"base", base},
          {"layers", ls},
          {"config", config},
          {"source", source},
          {"created_at", created_at},
          {"origin", origin}};
}

StatusOr<ClusterImage> ClusterImage::FromJson(std::string_view text) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument("image record is not a JSON object");
  ClusterImage r;
  try {
    r.name = j.at("name").get<std::string>();
    r.project = j.at("project").get<std::string>();
    r.base = j.value("base", "");
    r.config = j.value("config", Json::object());
    r.source = j.value("source", "");
    r.created_at = j.value("created_at", int64_t{0});
    r.origin = j.value("origin", "");
    for (const auto& l : j.at("layers")) {
      ClusterLayer cl;
      cl.digest = l.at("digest").get<std::string>();
      cl.size = l.value("size", uint64_t{0});
      cl.blob = l.at("blob").get<std::string>();
      cl.blob_size = l.at("blob_size").get<uint64_t>();
      if (!IsDigest(cl.digest) || !IsDigest(cl.blob))
        return InvalidArgument("image record " + r.name + ": a layer's digest is not sha256");
      r.layers.push_back(std::move(cl));
    }
  } catch (const Json::exception& e) {
    return InvalidArgument(std::string("image record: ") + e.what());
  }
  if (r.name.empty() || r.project.empty() || (r.base != "" && r.base != "host"))
    return InvalidArgument("image record " + r.name + ": no name, no project or a bad base");
  return r;
}

uint64_t ClusterImage::Size() const {
  uint64_t n = 0;
  for (const auto& l : layers) n += l.blob_size;
  return n;
}

Json LayerHolders::ToJson() const { return {{"layers", layers}}; }

StatusOr<LayerHolders> LayerHolders::FromJson(std::string_view text) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("layers") || !j["layers"].is_array())
    return InvalidArgument("layer holders record is not a JSON object with layers");
  LayerHolders h;
  for (const auto& d : j["layers"])
    if (d.is_string() && IsDigest(d.get<std::string>())) h.layers.push_back(d.get<std::string>());
  std::sort(h.layers.begin(), h.layers.end());
  return h;
}

std::string ImageKey(std::string_view name) { return StrCat({kImagesPrefix, name}); }
std::string LayersKey(std::string_view node) { return StrCat({kLayersPrefix, node}); }

}  // namespace dsec::cluster
