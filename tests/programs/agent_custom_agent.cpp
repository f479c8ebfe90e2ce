// agent-custom-agent: examples/custom_agent.cpp built with the tests, so every test flavour runs
// the example (a launcher whose loop over the job is its own).
#include "../../examples/custom_agent.cpp"
