// The store layer — the store: the store concept, the in-memory and prefix models, the TCP server (PyTorch's TCPStore protocol).
#pragma once

#include "elastic/detail/config.hpp"
