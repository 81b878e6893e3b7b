// The request head as the edge sees it: Beast's parsed header turned into an HttpRequest
// (method, raw target, lowercased header names, percent-decoded path and query). Shared by the
// server (server.cc) and the HTTP fuzz target (edge/http_fuzz.cc), so the fuzzer parses exactly
// what the server parses.
#pragma once

#include <boost/beast/http.hpp>

#include "http/server.h"

namespace dsec::http {

// Fills *req from the header. False (and *error, a 400) when the target's percent-encoding is
// malformed or the decoded path contains NUL; *req is then partly filled and must be dropped.
bool RequestFromHead(const boost::beast::http::request_header<>& h, HttpRequest* req,
                     HttpResponse* error);

}  // namespace dsec::http
