// The round planner: what a round is from its members alone (group ranks, rank bases, the
// world size, the master, the store's successors, the peers) and what an arrival or a seal
// leads to. Pure functions: no store, no coroutines.
#include <elastic/rendezvous/codec.hpp>
#include <elastic/rendezvous/concepts.hpp>
#include <elastic/rendezvous/planner.hpp>

#include <doctest/doctest.h>

#include "rendezvous_support.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace test_rendezvous_planner {

using elastic::node_info;
namespace rdzv = elastic::detail::rendezvous;

node_info info(int i, int nproc = 1) { return rendezvous_support::test_node(i, nproc); }

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST_CASE("planner: group ranks honour --node-rank, keep survivors' order, then arrival order") {
    using elastic::detail::rendezvous::assign_group_ranks;
    std::vector<node_info> nodes{info(0), info(1), info(2), info(3)};
    CHECK(std::get<0>(assign_group_ranks(nodes)) == std::vector<int>{0, 1, 2, 3});
    nodes[0].node_rank = 3;
    nodes[2].node_rank = 0;
    CHECK(std::get<0>(assign_group_ranks(nodes)) == std::vector<int>{3, 1, 0, 2});
    nodes[0].node_rank.reset();
    nodes[2].node_rank.reset();
    nodes[0].previous_rank = 2;
    nodes[1].previous_rank = 0;
    nodes[3].previous_rank = 1;  // node 2 is new: last
    CHECK(std::get<0>(assign_group_ranks(nodes)) == std::vector<int>{2, 0, 3, 1});

    std::vector<node_info> bad{info(0), info(1)};
    bad[0].node_rank = 1;
    bad[1].node_rank = 1;
    const auto twice = std::get<1>(assign_group_ranks(bad));
    CHECK(twice.find("--node-rank=1 given by two nodes, node0") != std::string::npos);
    bad[1].node_rank = 2;
    CHECK(std::get<1>(assign_group_ranks(bad)).find("--node-rank=2 of node1 (pid 101) is outside 0..1") !=
          std::string::npos);
}

TEST_CASE("planner: under elastic membership a --node-rank is a preference, honoured when it fits and is free") {
    using rdzv::assign_group_ranks;
    std::vector<node_info> nodes{info(0), info(1), info(2)};
    nodes[0].node_rank = 1;
    nodes[1].node_rank = 1;  // taken by node 0: it gets a rank like any other
    nodes[2].node_rank = 7;  // outside a round of 3: ignored
    CHECK(std::get<0>(assign_group_ranks(nodes, false)) == std::vector<int>{1, 0, 2});
    CHECK(has(std::get<1>(assign_group_ranks(nodes, true)), "--node-rank=1 given by two nodes"));
    nodes[1].node_rank.reset();
    CHECK(has(std::get<1>(assign_group_ranks(nodes, true)), "--node-rank=7 of node2 (pid 102) is outside 0..2"));
    nodes[2].node_rank = -1;
    CHECK(has(std::get<1>(assign_group_ranks(nodes, true)), "--node-rank=-1 of node2"));
    CHECK(std::get<0>(assign_group_ranks(nodes, false)) == std::vector<int>{1, 0, 2});
}

TEST_CASE("planner: the rest keep their previous order, stable among equals, newcomers follow in arrival order") {
    std::vector<node_info> nodes{info(0), info(1), info(2), info(3), info(4)};
    nodes[1].previous_rank = 1;
    nodes[3].previous_rank = 0;
    nodes[4].previous_rank = 1;  // the same previous rank as node 1: arrival order between them
    nodes[0].node_rank = 4;      // given: its rank first, whatever its previous one
    nodes[0].previous_rank = 0;
    CHECK(std::get<0>(rdzv::assign_group_ranks(nodes)) == std::vector<int>{4, 1, 3, 0, 2});
}

TEST_CASE("planner: a round's rank bases, world size, master and hosts follow the group ranks") {
    std::vector<node_info> nodes{info(0, 2), info(1, 3), info(2, 1)};
    nodes[0].node_rank = 2;
    nodes[2].node_rank = 0;
    const auto planned = rdzv::plan_round(nodes, true);
    REQUIRE(std::holds_alternative<rdzv::round_plan>(planned));
    const auto& plan = std::get<rdzv::round_plan>(planned);
    CHECK(plan.group_rank == std::vector<int>{2, 1, 0});
    CHECK(plan.rank_base == std::vector<int>{0, 1, 4});  // nproc 1 (node 2), 3 (node 1), 2 (node 0)
    CHECK(plan.world_size == 6);
    CHECK(plan.master == 2);
    CHECK(plan.hosts == std::vector<std::string>{"node2", "node1", "node0"});
    CHECK(plan.peers == std::vector<std::string>{"node0", "10.0.0.0", "node1", "10.0.0.1", "node2", "10.0.0.2"});
    CHECK_FALSE(plan.host_in);
    CHECK(plan.successors.empty());  // nobody has an idle server
}

TEST_CASE("planner: role ranks count within each role, by group rank, as torchrun counts them") {
    // Group ranks 0..3 in arrival order: trainer (2 workers), reader (1), trainer (3), reader (2).
    std::vector<node_info> nodes{info(0, 2), info(1, 1), info(2, 3), info(3, 2)};
    nodes[0].role = "trainer";
    nodes[1].role = "reader";
    nodes[2].role = "trainer";
    nodes[3].role = "reader";
    const auto planned = rdzv::plan_round(nodes, false);
    REQUIRE(std::holds_alternative<rdzv::round_plan>(planned));
    const auto& plan = std::get<rdzv::round_plan>(planned);
    REQUIRE(plan.group_rank == std::vector<int>{0, 1, 2, 3});
    CHECK(plan.rank_base == std::vector<int>{0, 2, 3, 6});
    CHECK(plan.role_rank_base == std::vector<int>{0, 0, 2, 1});
    CHECK(plan.role_world_size == std::vector<int>{5, 3, 5, 3});
    // One role: role ranks are the global ranks.
    for (auto& n : nodes) n.role = "default";
    const auto same_planned = rdzv::plan_round(nodes, false);
    REQUIRE(std::holds_alternative<rdzv::round_plan>(same_planned));
    const auto& same = std::get<rdzv::round_plan>(same_planned);
    CHECK(same.role_rank_base == same.rank_base);
    CHECK(same.role_world_size == std::vector<int>(4, same.world_size));
}

TEST_CASE("planner: a conflict or no node plans no round, and says why") {
    std::vector<node_info> nodes{info(0), info(1)};
    nodes[0].node_rank = 0;
    nodes[1].node_rank = 0;
    const auto conflict = rdzv::plan_round(nodes, true);
    REQUIRE(std::holds_alternative<std::string>(conflict));
    CHECK(has(std::get<std::string>(conflict),
              "--node-rank=0 given by two nodes, node0 (pid 100) and node1 (pid 101)"));
    CHECK(std::holds_alternative<rdzv::round_plan>(rdzv::plan_round(nodes, false)));
    CHECK(std::holds_alternative<std::string>(rdzv::plan_round({}, false)));
}

TEST_CASE("planner: successors are the first members by group rank with an idle server that do not host the store") {
    std::vector<node_info> nodes;
    for (int i = 0; i < 6; ++i) {
        auto n = info(i);
        n.id = "id" + std::to_string(i);
        n.backup_port = static_cast<std::uint16_t>(2000 + i);
        n.previous_rank = 5 - i;  // group ranks in reverse arrival order
        nodes.push_back(n);
    }
    nodes[5].hosts_store = true;  // group rank 0: hosts the store, so no successor
    nodes[4].backup_port = 0;     // group rank 1: no idle server
    const auto planned = rdzv::plan_round(nodes, false);
    REQUIRE(std::holds_alternative<rdzv::round_plan>(planned));
    const auto& plan = std::get<rdzv::round_plan>(planned);
    CHECK(plan.host_in);
    REQUIRE(plan.successors.size() == rdzv::max_successors);
    CHECK(plan.successors[0].id == "id3");
    CHECK(plan.successors[0].addr == "10.0.0.3");
    CHECK(plan.successors[0].port == 2003);
    CHECK(plan.successors[1].id == "id2");
    CHECK(plan.successors[2].id == "id1");
    CHECK(plan.master == 5);
}

TEST_CASE("planner: members whose idle server listens at a --rdzv-endpoint list's entry are successors first") {
    std::vector<node_info> nodes;
    for (int i = 0; i < 5; ++i) {
        auto n = info(i);
        n.id = "id" + std::to_string(i);
        n.backup_port = static_cast<std::uint16_t>(2000 + i);
        n.previous_rank = i;
        nodes.push_back(n);
    }
    nodes[0].hosts_store = true;
    nodes[0].backup_port = 0;
    nodes[4].backup_listed = true;
    nodes[2].backup_listed = true;
    const auto planned = rdzv::plan_round(nodes, false);
    REQUIRE(std::holds_alternative<rdzv::round_plan>(planned));
    const auto& plan = std::get<rdzv::round_plan>(planned);
    REQUIRE(plan.successors.size() == rdzv::max_successors);
    CHECK(plan.successors[0].id == "id2");  // listed, by group rank
    CHECK(plan.successors[1].id == "id4");
    CHECK(plan.successors[2].id == "id1");  // then the others
    // The flag travels in the node's record.
    CHECK(rdzv::decode_node(rdzv::encode(nodes[4])).backup_listed);
    CHECK_FALSE(rdzv::decode_node(rdzv::encode(nodes[1])).backup_listed);
}

TEST_CASE("planner: what an arrival does, fixed and elastic membership, and after the store moved") {
    using step = rdzv::arrival_step;
    const rdzv::round_rules fixed{3, false, 3, 0};
    CHECK(rdzv::on_arrival(1, fixed) == step::wait);
    CHECK(rdzv::on_arrival(2, fixed) == step::wait);
    CHECK(rdzv::on_arrival(3, fixed) == step::complete);
    CHECK(rdzv::on_arrival(4, fixed) == step::late);  // too many nodes
    CHECK(rdzv::on_arrival(rdzv::seal_increment + 1, fixed) == step::late);
    CHECK_FALSE(rdzv::has_last_call(2, fixed));

    const rdzv::round_rules elastic{4, true, 2, 0};
    CHECK(rdzv::on_arrival(1, elastic) == step::wait);
    CHECK(rdzv::on_arrival(2, elastic) == step::try_seal);
    CHECK(rdzv::on_arrival(3, elastic) == step::try_seal);
    CHECK(rdzv::on_arrival(4, elastic) == step::complete);
    CHECK(rdzv::on_arrival(rdzv::seal_increment + 2, elastic) == step::late);  // sealed with 1
    CHECK_FALSE(rdzv::has_last_call(1, elastic));
    CHECK(rdzv::has_last_call(2, elastic));

    const rdzv::round_rules moved{4, false, 2, 3};
    CHECK(rdzv::on_arrival(2, moved) == step::wait);
    CHECK(rdzv::on_arrival(3, moved) == step::seal);
    CHECK(rdzv::on_arrival(4, moved) == step::complete);
    CHECK(rdzv::has_last_call(2, moved));
}

TEST_CASE("planner: only the first seal completes the round, and only short of MAX") {
    const auto seal = rdzv::seal_increment;
    CHECK(rdzv::sealed_arrivals(seal + 2, 4) == std::optional<int>(2));
    CHECK(rdzv::sealed_arrivals(2 * seal + 2, 4) == std::nullopt);  // a second seal
    CHECK(rdzv::sealed_arrivals(seal + 4, 4) == std::nullopt);      // the 4th arrival completes it
    CHECK(rdzv::sealed_arrivals(seal, 4) == std::nullopt);          // nobody joined
    CHECK(rdzv::sealed_arrivals(3, 4) == std::nullopt);             // not a seal's count

    const rdzv::round_rules rules{4, true, 2, 0};
    CHECK(rdzv::may_seal_when_all_live(2, rules));
    CHECK(rdzv::may_seal_when_all_live(3, rules));
    CHECK_FALSE(rdzv::may_seal_when_all_live(1, rules));         // fewer than needed
    CHECK_FALSE(rdzv::may_seal_when_all_live(4, rules));         // MAX: the arrival completes it
    CHECK_FALSE(rdzv::may_seal_when_all_live(seal + 2, rules));  // sealed already
}

TEST_CASE("planner: quick rounds, and the rules of the first round after the store moved") {
    CHECK_FALSE(rdzv::quick_round(0, false, 0));  // the job's first round
    CHECK(rdzv::quick_round(1, false, 0));
    CHECK_FALSE(rdzv::quick_round(1, true, 0));   // admits nodes
    CHECK_FALSE(rdzv::quick_round(1, false, 2));  // after the store moved

    auto m = rdzv::after_store_moved(5, true);  // 4 left: a majority of 5, at once at all 4
    CHECK(m.quorum == 3);
    CHECK(m.target == 4);
    m = rdzv::after_store_moved(3, false);  // the host was no member: every member of 3
    CHECK(m.quorum == 2);
    CHECK(m.target == 3);
    m = rdzv::after_store_moved(2, true);  // 1 left is no majority of 2: the target is the quorum
    CHECK(m.quorum == 2);
    CHECK(m.target == 2);
    m = rdzv::after_store_moved(0, true);  // no round before: one node
    CHECK(m.quorum == 1);
    CHECK(m.target == 1);
}

}  // namespace test_rendezvous_planner
