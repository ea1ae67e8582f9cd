// One level of SAGE's beam pool on CPU (rerank_pool: beam, after the first round): the frontier's top-k children into
// the round's pool and the next frontier, in one call.  sage_plugin/core/beam_level.py documents the arguments; the
// torch path it replaces (SagePolicy.step: expand.propose, expand.budget_top_n, expand.append, sage._in_top) is the
// oracle, and this file follows it step by step so that every integer it writes and every float it adds is the same.
//
// Per request b (its rows are independent; F frontier slots, K children each, M = F * K candidates, P the pool's
// capacity, column P its trash column):
//   1. conf[b, frontier[f]] = top_conf[b, f] for every live frontier slot f.
//   2. candidate j = f * K + r: parent frontier[f], path value joint[parent] + gain[j] (float32 add; gain is the
//      draft log-probability top_values[j], or its calibrated factor), top-k path value joint_topk[parent] +
//      top_logp_topk[j], rank r, code code[parent] * (K + 1) + r + 1, live where the slot is and top_values[j] is
//      finite.
//   3. the beam: the width[b] live candidates of highest path value grow (ties: the lower j).
//   4. every live candidate enters the pool in descending insertion key (path value, or -j under parent_order; ties:
//      the lower j) at slots count, count + 1, ...; those past the capacity are dropped; depth = level.
//   5. the next frontier: the beam's candidates that entered, in insertion order, kept where the node is among the
//      pool's n_best most valuable nodes (ties: the earlier node) and cut to out_width; -1 after.
// Nothing is written to the trash column (the torch path scatters its dropped entries there; nothing reads it).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

namespace {

constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

void check(const at::Tensor& t, at::ScalarType dtype, at::IntArrayRef sizes, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == dtype && t.is_contiguous() && t.sizes() == sizes,
              "beam_level: ", name, " must be a contiguous CPU ", c10::toString(dtype), " tensor of shape ", sizes,
              ", got ", t.scalar_type(), " ", t.sizes());
}

// Indices 0..n-1 in descending key order, ties by index (torch.sort(descending=True, stable=True)).
std::vector<int64_t> order_desc(const std::vector<float>& key) {
  std::vector<int64_t> idx(key.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return key[a] > key[b]; });
  return idx;
}

}  // namespace

at::Tensor beam_level(at::Tensor tokens, at::Tensor parents, at::Tensor depths, at::Tensor logp, at::Tensor logp_topk,
                      at::Tensor joint, at::Tensor joint_topk, at::Tensor ranks, at::Tensor codes, at::Tensor conf,
                      at::Tensor count, const at::Tensor& frontier, const at::Tensor& top_values,
                      const at::Tensor& gain, const at::Tensor& top_tokens, const at::Tensor& top_logp_topk,
                      const at::Tensor& top_conf,
                      const at::Tensor& width, int64_t level, int64_t n_best, int64_t out_width, bool best_first) {
  TORCH_CHECK(frontier.dim() == 2 && top_values.dim() == 3 && tokens.dim() == 2,
              "beam_level: frontier [B, F], top_values [B, F, K] and the pool's [B, P + 1] columns expected");
  const int64_t B = frontier.size(0), F = frontier.size(1), K = top_values.size(2), M = F * K;
  const int64_t cols = tokens.size(1), P = cols - 1;
  for (auto [t, name] : {std::pair{&tokens, "tokens"}, {&parents, "parents"}, {&depths, "depths"}, {&ranks, "ranks"},
                         {&codes, "codes"}})
    check(*t, at::kLong, {B, cols}, name);
  for (auto [t, name] : {std::pair{&logp, "logp"}, {&logp_topk, "logp_topk"}, {&joint, "joint"},
                         {&joint_topk, "joint_topk"}, {&conf, "conf"}})
    check(*t, at::kFloat, {B, cols}, name);
  check(frontier, at::kLong, {B, F}, "frontier");
  check(top_conf, at::kFloat, {B, F}, "top_conf");
  check(top_values, at::kFloat, {B, F, K}, "top_values");
  check(gain, at::kFloat, {B, F, K}, "gain");
  check(top_tokens, at::kLong, {B, F, K}, "top_tokens");
  check(top_logp_topk, at::kFloat, {B, F, K}, "top_logp_topk");
  check(count, at::kLong, {B}, "count");
  check(width, at::kLong, {B}, "width");
  TORCH_CHECK(out_width >= 0, "beam_level: out_width must be >= 0");

  auto out = at::full({B, out_width}, -1, frontier.options());
  int64_t *tok = tokens.data_ptr<int64_t>(), *par = parents.data_ptr<int64_t>(), *dep = depths.data_ptr<int64_t>();
  int64_t *rnk = ranks.data_ptr<int64_t>(), *cod = codes.data_ptr<int64_t>(), *cnt = count.data_ptr<int64_t>();
  float *lp = logp.data_ptr<float>(), *lpt = logp_topk.data_ptr<float>(), *jn = joint.data_ptr<float>();
  float *jnt = joint_topk.data_ptr<float>(), *cf = conf.data_ptr<float>();
  const int64_t *fr = frontier.data_ptr<int64_t>(), *tt = top_tokens.data_ptr<int64_t>();
  const int64_t *wd = width.data_ptr<int64_t>();
  const float *tv = top_values.data_ptr<float>(), *gn = gain.data_ptr<float>(), *tlt = top_logp_topk.data_ptr<float>();
  const float* tc = top_conf.data_ptr<float>();
  int64_t* res = out.data_ptr<int64_t>();

  at::parallel_for(0, B, 4, [&](int64_t b0, int64_t b1) {
    std::vector<float> value(M), key(M), c_joint(M);
    std::vector<char> live(M), grows(M);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t row = b * cols, *f_idx = fr + b * F;
      for (int64_t f = 0; f < F; ++f)  // 1. the frontier's own confidence
        if (f_idx[f] >= 0) cf[row + f_idx[f]] = tc[b * F + f];
      for (int64_t j = 0; j < M; ++j) {  // 2. the candidates' path values (the rest is written in step 4)
        const int64_t parent = f_idx[j / K];
        live[j] = parent >= 0 && std::isfinite(tv[b * M + j]);
        c_joint[j] = jn[row + std::max<int64_t>(parent, 0)] + gn[b * M + j];
        value[j] = live[j] ? c_joint[j] : NEG_INF;
        if (!best_first) key[j] = live[j] ? -static_cast<float>(j) : NEG_INF;
      }
      const auto by_value = order_desc(value);  // 3. the beam: the first width[b] places by path value
      for (int64_t place = 0; place < M; ++place) grows[by_value[place]] = live[by_value[place]] && place < wd[b];
      // 4. into the pool in insertion order (by path value: the beam's own order); a live candidate's parent is an
      // earlier pool node than any slot written here, so reading its columns while writing is safe
      const auto by_key = best_first ? by_value : order_desc(key);
      const int64_t start = cnt[b];
      int64_t kept = 0;
      std::vector<int64_t> grown;  // slots of the beam's candidates that entered, in insertion order
      for (int64_t s = 0; s < M; ++s) {
        const int64_t j = by_key[s];
        if (!live[j]) continue;
        const int64_t slot = start + kept++;
        if (slot >= P) continue;
        const int64_t at = row + slot, base = b * M + j, parent = row + f_idx[j / K], r = j % K;
        tok[at] = tt[base];
        par[at] = f_idx[j / K];
        dep[at] = level;
        lp[at] = tv[base];
        lpt[at] = tlt[base];
        jn[at] = c_joint[j];
        jnt[at] = jnt[parent] + tlt[base];
        rnk[at] = r;
        cod[at] = cod[parent] * (K + 1) + r + 1;
        if (grows[j]) grown.push_back(slot);
      }
      const int64_t filled = std::min(start + kept, P);
      cnt[b] = filled;
      // 5. a grown node stays on the frontier when fewer than n_best pool nodes (1 .. filled - 1) rank above it
      int64_t n_out = 0;
      for (const int64_t i : grown) {
        if (n_out == out_width) break;
        int64_t place = 0;
        for (int64_t other = 1; other < filled && place < n_best; ++other)
          place += jn[row + other] > jn[row + i] || (other < i && jn[row + other] == jn[row + i]);
        if (place < n_best) res[b * out_width + n_out++] = i;
      }
    }
  });
  return out;
}

namespace {

// cost.py's _rates: expected tokens per millisecond when every request verifies its q best nodes, q = 0..m.
at::Tensor rates(const at::Tensor& ordered, const at::Tensor& round_ms) {
  const int64_t m = std::min(ordered.size(1), round_ms.size(0) - 1);
  const auto head = ordered.slice(1, 0, m);
  const auto per_q = at::cumsum(head.exp(), 1).sum(0);
  return (at::cat({per_q.new_zeros({1}), per_q}) + head.size(0)) / round_ms.slice(0, 0, m + 1);
}

}  // namespace

// cost.py's level_pays, operator for operator (the same ATen calls on the same tensors, so the same bits and the same
// decision) without the Python between them: joint / depths are the pool's [B, P + 1] columns, count [B].
at::Tensor level_pays(const at::Tensor& joint, const at::Tensor& depths, const at::Tensor& count, int64_t level,
                      const at::Tensor& round_ms, const std::optional<at::Tensor>& next_round_ms) {
  const int64_t P = joint.size(1) - 1;
  const auto filled = at::arange(1, P, count.options()).lt(count.unsqueeze(1));
  const auto value = at::where(filled, joint.slice(1, 1, P), -std::numeric_limits<double>::infinity());
  const auto sorted = at::sort(value, /*stable=*/true, /*dim=*/1, /*descending=*/true);
  const auto& order = std::get<1>(sorted);
  const auto ar = at::arange(value.size(1), order.options()).expand_as(order);
  const auto place = at::empty_like(ar).scatter_(1, order, ar);
  const auto now = rates(std::get<0>(sorted), round_ms);
  const auto cut = filled.logical_and(place.lt(now.argmax()));
  const auto at_level = filled.logical_and(depths.slice(1, 1, P).eq(level));
  const auto keep = cut.logical_and(at_level).any();
  if (!next_round_ms) return keep;
  const int64_t m = std::min(value.size(1), next_round_ms->size(0) - 1);
  const auto virt = at::where(at_level, value, -std::numeric_limits<double>::infinity());
  const auto top = std::get<0>(at::topk(at::cat({value, virt}, 1), m, 1));
  return keep.logical_and(rates(top, *next_round_ms).max().gt(now.max()));
}

// beam_level: one level of SAGE's beam pool, the pool's columns written in place (sage_plugin/core/beam_level.py);
// level_pays: cost.level_pays without the Python between its operators.  Their fake kernels:
// sage_plugin/kernels/beam_level.py.
TORCH_LIBRARY_FRAGMENT(sage_plugin, m) {
  m.def(
      "beam_level(Tensor(a!) tokens, Tensor(b!) parents, Tensor(c!) depths, Tensor(d!) logp, Tensor(e!) logp_topk, "
      "Tensor(f!) joint, Tensor(g!) joint_topk, Tensor(h!) ranks, Tensor(i!) codes, Tensor(j!) conf, "
      "Tensor(k!) count, Tensor frontier, Tensor top_values, Tensor gain, Tensor top_tokens, Tensor top_logp_topk, "
      "Tensor top_conf, Tensor width, int level, int n_best, int out_width, bool best_first) -> Tensor");
  m.def("level_pays(Tensor joint, Tensor depths, Tensor count, int level, Tensor round_ms, Tensor? next_round_ms) -> Tensor");
}

TORCH_LIBRARY_IMPL(sage_plugin, CPU, m) {
  m.impl("beam_level", &beam_level);
  m.impl("level_pays", &level_pays);
}
