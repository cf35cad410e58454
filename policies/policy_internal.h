/*
 * policy_internal.h — the per-policy key functions behind policy_key(); policies/ only.
 */
#ifndef KVC_POLICY_INTERNAL_H
#define KVC_POLICY_INTERNAL_H

#include "policies/policy.h"

/* Keys of blocks that must stay (sinks under sink-aware policies) sit above any time key. */
#define POLICY_KEY_KEEP 1e300

/* log2 of a decayed count as of `at`, in the time-invariant form log2(c) + at / h. */
double policy_decayed_log(double count, uint64_t at, const struct policy_params *p);

double policy_lru_key(const struct policy_block *b, const struct policy_params *p);
double policy_lfu_key(const struct policy_block *b, const struct policy_params *p);
double policy_prefix_key(const struct policy_block *b, const struct policy_params *p);
double policy_prefix_cost(const struct policy_block *b, const struct policy_params *p);
double policy_streaming_key(const struct policy_block *b, const struct policy_params *p);
double policy_h2o_key(const struct policy_block *b, const struct policy_params *p);
double policy_snapkv_key(const struct policy_block *b, const struct policy_params *p);
double policy_keynorm_key(const struct policy_block *b, const struct policy_params *p);
double policy_vatp_key(const struct policy_block *b, const struct policy_params *p);
double policy_default_key(const struct policy_block *b, const struct policy_params *p);

#endif
