// examples/worker.cpp built as a test program, so every CI flavour runs the example the issue's
// "done when" names (RANK=3 WORLD_SIZE=2 fails naming both; nothing set is rank 0 of 1).
#include "../../examples/worker.cpp"
