// A downstream program built with separate compilation that uses the pieces whose definitions
// live in elastic::compiled (the event log, error files, the agent's error file, the
// rendezvous's store values) without including the full JSON library: it links only if the
// library compiled them. It checks what each returns and prints "pieces ok".
#include <elastic.hpp>

#ifndef ELASTIC_SEPARATE_COMPILATION
#error "elastic::compiled defines ELASTIC_SEPARATE_COMPILATION for the programs that link it"
#endif
#ifdef INCLUDE_NLOHMANN_JSON_HPP_
#error "with ELASTIC_SEPARATE_COMPILATION, elastic's headers include only <nlohmann/json_fwd.hpp>"
#endif

#include <cstdio>
#include <string>

namespace {

int failed = 0;

void expect(bool ok, const char* what) {
    if (!ok) {
        std::fprintf(stderr, "pieces: %s\n", what);
        ++failed;
    }
}

}  // namespace

int main() {
    elastic::event e;
    e.name = "elastic.test";
    e.metadata["pid"] = 42;
    e.metadata["state"] = "FAILED";
    e.metadata["signal"] = nullptr;
    expect(
        e.serialize() ==
            R"({"name":"elastic.test","source":"AGENT","timestamp":0,"metadata":{"pid":42,"state":"FAILED","signal":null}})",
        "event::serialize wrote something else");

    const auto read = elastic::parse_error_file(R"({"message": "flat", "timestamp": 1})", "/e");
    expect(read.parsed() && read.content.message == "flat", "parse_error_file did not read a flat file");
    expect(elastic::parse_error_file("{", "/e").status == elastic::error_file_status::malformed,
           "parse_error_file took a broken file");

    elastic::worker_event_context ctx;
    ctx.run_id = "r";
    const auto done = elastic::worker_succeeded_event({7, 0, 0, "default"}, ctx, {});
    expect(done.name == "torchelastic.worker.status.SUCCEEDED" && done.metadata["worker_id"] == "7",
           "worker_succeeded_event");

    elastic::job_decision decision{true, 0, "again"};
    const auto back = elastic::detail::rendezvous::decode_decision(elastic::detail::rendezvous::encode(decision));
    expect(back.restart && back.reason == "again", "the rendezvous codec did not read back its decision");

    if (failed != 0) return 1;
    std::printf("pieces ok\n");
    return 0;
}
