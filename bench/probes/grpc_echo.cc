// A gRPC server in C++ that answers every unary call with the message it got, whatever the
// method: the floor a protocol front outside Python would have, for bench/serve_front_floor.py
// (--native-echo) to time beside Python's grpc.aio echo and `kiln serve`.
// Build (Debian: apt-get install libgrpc++-dev):
//   g++ -O2 -std=c++17 bench/probes/grpc_echo.cc -o grpc_echo $(pkg-config --cflags --libs grpc++)
// Run: grpc_echo PORT   (listens on 127.0.0.1:PORT, prints "listening" once it does)
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <string>

namespace {

// One call: read the request, write it back and finish in one step.
class EchoReactor final : public grpc::ServerGenericBidiReactor {
 public:
  EchoReactor() { StartRead(&message_); }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    StartWriteAndFinish(&message_, grpc::WriteOptions(), grpc::Status::OK);
  }
  void OnDone() override { delete this; }

 private:
  grpc::ByteBuffer message_;
};

class EchoService final : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override { return new EchoReactor; }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: grpc_echo PORT\n");
    return 2;
  }
  EchoService service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(std::string("127.0.0.1:") + argv[1], grpc::InsecureServerCredentials());
  builder.RegisterCallbackGenericService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) {
    std::fprintf(stderr, "grpc_echo: cannot listen on 127.0.0.1:%s\n", argv[1]);
    return 1;
  }
  std::printf("listening\n");
  std::fflush(stdout);
  server->Wait();
  return 0;
}
