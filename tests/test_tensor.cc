// Tests of Tensor's storage (ref/tensor.h): the std::vector operations the code base uses, and the
// borrowed mode (BorrowedTensor) that lets a caller's memory reach the kernels without a copy.
#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "ref/error.h"
#include "ref/tensor.h"
#include "ref/topk.h"

using namespace indexshare;

TEST_CASE("tensor storage: the vector operations the code base uses") {
  Storage<int32_t> s = std::vector<int32_t>{1, 2, 3};
  CHECK(s.size() == 3);
  CHECK(s == std::vector<int32_t>{1, 2, 3});
  CHECK(std::vector<int32_t>{1, 2, 3} == s);
  CHECK(s != std::vector<int32_t>{1, 2, 4});
  s = {4, 5};
  CHECK(s == std::vector<int32_t>{4, 5});
  s.insert(s.end(), s.begin(), s.end());  // a range of itself (concat_rows of a tensor with itself)
  CHECK(s == std::vector<int32_t>{4, 5, 4, 5});
  s.assign(s.begin() + 1, s.begin() + 3);
  CHECK(s == std::vector<int32_t>{5, 4});
  s.resize(3);
  CHECK(s == std::vector<int32_t>{5, 4, 0});
  int32_t sum = 0;
  for (int32_t& v : s) sum += v++;
  CHECK(sum == 9);
  CHECK(s == std::vector<int32_t>{6, 5, 1});
  Storage<int32_t> c = s;  // a copy owns its elements
  c[0] = 7;
  CHECK(s[0] == 6);
  const int32_t* p = s.data();
  Storage<int32_t> m = std::move(s);  // a move keeps the buffer and empties the source
  CHECK(m.data() == p);
  CHECK(s.empty());  // NOLINT: the moved-from state is specified here: empty and owning
  s.push_back(3);
  CHECK(s == std::vector<int32_t>{3});
  Tensor<float> t({2, 3}, 1.5f);
  CHECK(t.numel() == 6);
  CHECK(t.at(1, 2) == 1.5f);
  CHECK(!t.data.borrowed());
}

TEST_CASE("tensor storage: a BorrowedTensor reads the caller's memory in place, and nothing writes it") {
  std::vector<float> mem = {3, 1, 2, 5, 4, 0};
  const BorrowedTensor<float> b({2, 3}, mem.data());
  const Tensor<float>& t = b;
  CHECK(t.ptr() == mem.data());  // no copy
  CHECK(t.data.borrowed());
  CHECK(t.shape == Shape{2, 3});
  CHECK(t.at(1, 0) == 5.0f);
  mem[4] = 9;  // a view: the caller's change is seen
  CHECK(t.at(1, 1) == 9.0f);
  CHECK(t.data == std::vector<float>{3, 1, 2, 5, 9, 0});

  Tensor<float> copy = t;  // a copy owns its elements
  CHECK(copy.ptr() != mem.data());
  CHECK(!copy.data.borrowed());
  copy.at(0, 0) = -1;
  copy.data.push_back(7);
  CHECK(mem[0] == 3.0f);
  CHECK(mem.size() == 6);

  const BorrowedTensor<float> moved = BorrowedTensor<float>(Shape{6}, mem.data());
  CHECK(moved.get().ptr() == mem.data());
  CHECK_THROWS_AS(BorrowedTensor<float>(Shape{2}, nullptr), Error);
  CHECK(BorrowedTensor<float>(Shape{0}, nullptr).get().numel() == 0);

  // take(): the view as a Tensor for an aggregate (ref::AttentionOut), still borrowed; a mutator
  // makes it owning first, so the caller's memory is never written.
  Tensor<float> taken = BorrowedTensor<float>(Shape{3}, mem.data() + 3).take();
  CHECK(std::as_const(taken).ptr() == mem.data() + 3);  // const access: non-const asserts on a view
  CHECK(taken.data.borrowed());
  CHECK(taken.data == std::vector<float>{5, 9, 0});
  taken.data.push_back(1);
  CHECK(!taken.data.borrowed());
  CHECK(taken.data == std::vector<float>{5, 9, 0, 1});
  CHECK(mem == std::vector<float>{3, 1, 2, 5, 9, 0});
}

TEST_CASE("tensor storage: a view with an owner keeps its memory alive wherever it is moved, and drops it when it owns") {
  // keep: what diff's views of a mapped file hold (the mapping). The creator lets go at once.
  auto mem = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4});
  const std::weak_ptr<std::vector<float>> alive = mem;
  const float* p = mem->data();
  Tensor<float> t = BorrowedTensor<float>(Shape{4}, p, mem).take();
  mem.reset();
  REQUIRE(!alive.expired());  // the view holds it
  Tensor<float> moved = std::move(t);
  Tensor<float> assigned;
  assigned = std::move(moved);
  CHECK(std::as_const(assigned).ptr() == p);
  CHECK(assigned.data.borrowed());
  CHECK(assigned.data == std::vector<float>{1, 2, 3, 4});
  CHECK(!alive.expired());
  {
    const Tensor<float> copy = assigned;  // a copy owns its elements and holds nothing
    CHECK(!copy.data.borrowed());
    CHECK(alive.use_count() == 1);
  }
  assigned.data.push_back(5);  // owning now: the view, and what it kept, are let go
  CHECK(!assigned.data.borrowed());
  CHECK(alive.expired());
  CHECK(assigned.data == std::vector<float>{1, 2, 3, 4, 5});
  // Dropped whole: the owner goes with the last view.
  auto mem2 = std::make_shared<std::vector<float>>(3, 7.0f);
  const std::weak_ptr<std::vector<float>> alive2 = mem2;
  {
    Tensor<float> v = BorrowedTensor<float>(Shape{3}, mem2->data(), mem2).take();
    mem2.reset();
    CHECK(!alive2.expired());
    v.data = Storage<float>();
    CHECK(alive2.expired());
  }
}

TEST_CASE("tensor storage: a kernel gives the same result on borrowed and owned inputs") {
  std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 0.25f, 3.0f, 1.0f, 1.0f};
  std::vector<int32_t> ks = {0, 0}, ke = {4, 3};
  const BorrowedTensor<float> bl({2, 4}, logits.data());
  const BorrowedTensor<int32_t> bks({2}, ks.data()), bke({2}, ke.data());
  Tensor<float> ol({2, 4});
  ol.data = logits;
  Tensor<int32_t> oks({2}), oke({2});
  oks.data = ks;
  oke.data = ke;
  const Tensor<int32_t> a = ref::topk(bl, bks, bke, 2), o = ref::topk(ol, oks, oke, 2);
  CHECK(a.data == o.data);
  CHECK(a.data == std::vector<int32_t>{1, 3, 1, 2});
}
