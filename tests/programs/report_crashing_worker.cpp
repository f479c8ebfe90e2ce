// report-crashing-worker: examples/crashing_worker.cpp built with the tests, so the report tests
// check the report docs/failure-report.md shows for it (every test flavour builds no examples).
#include "../../examples/crashing_worker.cpp"
