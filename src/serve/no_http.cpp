// Builds without cpp-httplib: the scheduler is there, the HTTP server is not.
#include "serve/http_server.h"

namespace sluice::serve {

bool http_available() { return false; }

struct HttpServer::Impl {};
HttpServer::HttpServer(Scheduler&, const model::Tokenizer&, const model::ChatTemplate*, ServerOptions) {}
HttpServer::~HttpServer() = default;
Status HttpServer::bind() { return unsupported("this sluice was built without cpp-httplib (libcpp-httplib-dev)"); }
int HttpServer::port() const { return -1; }
Status HttpServer::run() { return unsupported("this sluice was built without cpp-httplib (libcpp-httplib-dev)"); }
void HttpServer::stop() {}

}  // namespace sluice::serve
