#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>

namespace my_device {

// How many times each op (by "aten::name.overload") went through the copying fallback.
std::unordered_map<std::string, int64_t> fallback_counts();
void reset_fallback_counts();

} // namespace my_device
