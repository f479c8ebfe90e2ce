// SPDX-License-Identifier: MIT
// elastic::dist::sampler: this rank's share of a dataset's indices, the same sequence PyTorch's
// DistributedSampler gives for the same arguments (shuffled with seed + epoch, padded or trimmed
// so that every rank gets as many).
#pragma once

#include "elastic/env.hpp"

#include "elastic/detail/format.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

namespace elastic::inline v0::dist {

/// How a sampler splits the dataset (torch.utils.data.DistributedSampler's arguments).
struct sampler_options {
    std::optional<int> num_replicas{};  ///< the ranks sharing the dataset; WORLD_SIZE when unset
    std::optional<int> rank{};          ///< this rank among them; RANK when unset
    bool shuffle = true;                ///< a permutation drawn from seed + epoch, else 0..N-1 in order
    std::uint64_t seed = 0;             ///< must be the same on every rank
    bool drop_last = false;             ///< trim the tail to a multiple of num_replicas, else pad by repetition
};

/// The indices of a dataset of `size` elements that this rank visits in an epoch. With shuffle,
/// the permutation is torch.randperm(size) from a torch.Generator seeded with seed + epoch (a
/// Mersenne Twister seeded with the low 32 bits, and the forward Fisher-Yates shuffle of torch
/// 1.13's CPU randperm), so a C++ rank and a PyTorch rank with the same arguments visit the same
/// elements in the same order. (PyTorch 2 draws differently from 2^32 / 20 = 214,748,364
/// elements on.)
class sampler {
public:
    explicit sampler(std::int64_t size, sampler_options options = {})
        : size_(size),
          options_(options),
          replicas_(options.num_replicas ? *options.num_replicas : env().world_size),
          rank_(options.rank ? *options.rank : env().rank) {
        if (size_ < 0)
            throw std::invalid_argument(elastic::detail::format("elastic::dist::sampler: a dataset of {} elements",
                                                                size_));
        if (replicas_ < 1)
            throw std::invalid_argument(
                elastic::detail::format("elastic::dist::sampler: num_replicas {} is not 1 or more", replicas_));
        if (rank_ < 0 || rank_ >= replicas_)
            throw std::invalid_argument(
                elastic::detail::format("elastic::dist::sampler: invalid rank {}, rank should be in the "
                                        "interval [0, {}]",
                                        rank_, replicas_ - 1));
        const auto r = static_cast<std::int64_t>(replicas_);
        // torch: ceil((N - R) / R) with drop_last and an uneven N, which is N / R; else ceil(N / R).
        num_samples_ = options_.drop_last ? size_ / r : (size_ + r - 1) / r;
    }

    /// Sets the epoch the next indices() shuffles for (call it before every epoch, as with torch).
    void set_epoch(std::uint64_t epoch) noexcept { epoch_ = epoch; }
    [[nodiscard]] std::uint64_t epoch() const noexcept { return epoch_; }

    /// How many indices this rank gets (the same on every rank).
    [[nodiscard]] std::int64_t num_samples() const noexcept { return num_samples_; }
    /// num_samples() times the number of replicas.
    [[nodiscard]] std::int64_t total_size() const noexcept { return num_samples_ * replicas_; }
    [[nodiscard]] int num_replicas() const noexcept { return replicas_; }
    [[nodiscard]] int rank() const noexcept { return rank_; }

    /// This rank's indices for the current epoch, in visiting order.
    [[nodiscard]] std::vector<std::int64_t> indices() const {
        const auto all = permutation();
        std::vector<std::int64_t> mine;
        mine.reserve(static_cast<std::size_t>(num_samples_));
        const auto total = total_size();
        // The padded (or trimmed) list is all[i % size]; this rank takes every num_replicas-th.
        for (std::int64_t i = rank_; i < total; i += replicas_)
            mine.push_back(all[static_cast<std::size_t>(i % size_)]);
        return mine;
    }

    /// The whole dataset's order for the current epoch, before padding and splitting.
    [[nodiscard]] std::vector<std::int64_t> permutation() const {
        std::vector<std::int64_t> p(static_cast<std::size_t>(size_));
        for (std::int64_t i = 0; i < size_; ++i) p[static_cast<std::size_t>(i)] = i;
        if (!options_.shuffle || size_ < 2) return p;
        // torch.Generator.manual_seed(s) seeds its mt19937 with s's low 32 bits; randperm on the
        // CPU (torch 1.13, at every size) swaps element i with i + (next() % (N - i)) for
        // i = 0 .. N-2. Later versions draw the same below 2^32 / 20 elements and otherwise above.
        std::mt19937 engine(static_cast<std::uint32_t>(options_.seed + epoch_));
        for (std::int64_t i = 0; i < size_ - 1; ++i) {
            const auto z = static_cast<std::int64_t>(engine() % static_cast<std::uint64_t>(size_ - i));
            std::swap(p[static_cast<std::size_t>(i)], p[static_cast<std::size_t>(i + z)]);
        }
        return p;
    }

private:
    std::int64_t size_;
    sampler_options options_;
    int replicas_;
    int rank_;
    std::int64_t num_samples_ = 0;
    std::uint64_t epoch_ = 0;
};

}  // namespace elastic::inline v0::dist
