// agent-elasticrun: examples/elasticrun.cpp built with the tests, so every test flavour
// (including the ThreadSanitizer one, which builds no examples) runs the real launcher.
#include "../../examples/elasticrun.cpp"
