// SPDX-License-Identifier: MIT
// The library's version: elastic::version and elastic::version_string.
#pragma once

#include "elastic/detail/config.hpp"
