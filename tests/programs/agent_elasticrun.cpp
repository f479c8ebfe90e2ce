// agent-elasticrun: src/elasticrun.cpp built with the tests, so every test flavour
// (including the ThreadSanitizer one, which builds no programs) runs the real launcher.
#include "../../src/elasticrun.cpp"
