// agent-trainer: examples/trainer.cpp built with the tests (the native worker using
// elastic::env() and elastic::dist that the agent's tests run under elasticrun).
#include "../../examples/trainer.cpp"
