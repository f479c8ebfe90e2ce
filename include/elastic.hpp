// elastic — a header-only C++20 launcher framework: rendezvous, worker supervision, fault
// tolerance and elasticity for native distributed trainers. This umbrella header includes every
// public header; single_include/elastic.hpp is generated from it by tools/amalgamate.py.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/version.hpp"
