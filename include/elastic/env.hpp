// elastic::env(): the worker's typed, validated view of the environment contract.
#pragma once

#include "elastic/detail/config.hpp"
