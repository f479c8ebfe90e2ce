// policy-custom-launcher: examples/custom_policy.cpp built with the tests, so every test flavour
// runs the example (CI's "the custom-policy example runs").
#include "../../examples/custom_policy.cpp"
