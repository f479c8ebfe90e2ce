// SPDX-License-Identifier: MIT
// elastic — a header-only C++20 launcher framework: rendezvous, worker supervision, fault
// tolerance and elasticity for native distributed trainers. This umbrella header includes every
// public header; single_include/elastic.hpp is generated from it by tools/amalgamate.py.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/error.hpp"
#include "elastic/version.hpp"

// Worker side.
#include "elastic/env.hpp"
#include "elastic/record.hpp"
#include "elastic/watchdog.hpp"

// Layers (each of these includes the public headers of its folder).
#include "elastic/store.hpp"
// The worker's collectives, after the store: dist.hpp includes the store client only where
// its definitions are compiled, and the single header keeps a header's first inclusion only.
#include "elastic/dist.hpp"
#include "elastic/dist/json.hpp"
#include "elastic/process.hpp"
#include "elastic/report.hpp"
#include "elastic/rendezvous.hpp"
#include "elastic/policy.hpp"
#include "elastic/agent.hpp"

// The launcher: torchrun's command line (CLI11), the launch configuration and elastic::run. A
// file that only works (env(), record, dist) or runs an agent loop of its own may define
// ELASTIC_NO_LAUNCHER before including this header: it then needs no CLI11 and does not parse it.
// (The one file that defines ELASTIC_IMPL_SOURCE must not.)
#ifndef ELASTIC_NO_LAUNCHER
// The etcd-v3 backend: its client (HTTP, TLS) is compiled only where a launcher is.
#include "elastic/rendezvous/etcd_rendezvous.hpp"
#include "elastic/launch.hpp"
#include "elastic/run.hpp"
#endif

// The definitions ELASTIC_SEPARATE_COMPILATION compiles in one file (nothing when header-only).
#include "elastic/impl/src.hpp"
