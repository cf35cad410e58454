#!/bin/sh
# tests/mutation/run.sh [NAME...] — `make mutation`: do the suites catch real bugs?
#
# Copies the working tree (tracked and untracked, not ignored files) to a temporary
# directory, builds it (CUDA=0), checks that the relevant suites pass there, then applies one
# deliberate bug at a time — each a literal replacement in one file that must match exactly
# once — rebuilds what the suites need, runs them, and restores the file. A mutation the
# suites fail on is "killed"; one they pass is "survived" (a test to add); one whose text is
# no longer in the tree is "not applied" and one that does not build "no build" (fix the
# mutation). Prints the table mutation -> result and exits 0 only when every mutation was
# killed. With names, only those mutations run; an unknown name (or option) is refused with
# exit status 2, naming the nearest known one, before anything is built; --help lists them.
# Deadlines scale with $KVC_TEST_SLOW.
# Not part of make check: 2-5 minutes on two cores.
set -u
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/kvcd-mutation.XXXXXX)
trap 'rm -rf "$work"' EXIT INT TERM
slow=${KVC_TEST_SLOW:-1}
only="$*"
log="$work/log"
results=""

# ---- the mutations: name | file | suites | text | replacement ---------------------------

m_names="" # in order
mutation() {
    m_names="$m_names $1"
    eval "m_file_$(echo "$1" | tr -- '-.' '__')=\$2"
    eval "m_suites_$(echo "$1" | tr -- '-.' '__')=\$3"
    eval "m_old_$(echo "$1" | tr -- '-.' '__')=\$4"
    eval "m_new_$(echo "$1" | tr -- '-.' '__')=\$5"
}

# A wrong rounding mode in a codec: the AVX2 q8_0 encoder rounds half to even, not away
# from zero as roundf (and ggml) do.
mutation codec-q8_0-round-half-even kernels/kern_avx2_ggml.h "check_kernels" \
'        q[i] = _mm256_cvttps_epi32(v_roundf_pre(_mm256_mul_ps(v[i], vid)));' \
'        q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], vid));'

# A wrong rounding mode in a codec: the reference E4M3 encoder rounds ties up, not to even.
mutation codec-fp8-ties-up kernels/kern_fmt.h "check_kernels" \
'        uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);' \
'        uint32_t r = a + 0x7ffffu + 1u;'

# The AVX-512 KIVI decoder (issue 30): a 2-bit key's high code bit tested at the low bit's
# place, so codes 1 and 3 (2 and 0) decode alike. Only a CPU with AVX-512 runs that decoder:
# elsewhere this mutation survives.
mutation kivi512-k2-high-bit kernels/kern_kivi512.c "check_kernels check_codecs" \
'    const __m512i b1 = _mm512_add_epi16(b0, b0);' \
'    const __m512i b1 = b0;'

# The AVX-512 ROT key decoder (issue 30): the butterfly stage of channel bit 2, an exchange
# between a pair's registers, takes its second half with the registers' roles swapped, so
# each channel meets the wrong partner. Only a CPU with AVX-512 runs that decoder.
mutation rot512-exchange-partner kernels/kern_rot512.c "check_codecs" \
'        y = _mm512_shuffle_ps(*a, *b, 0xee);' \
'        y = _mm512_shuffle_ps(*b, *a, 0xee);'

# The same decoder's rows two at a time: the second row takes the first row's head for its
# signs and means (rows of different heads side by side decode wrongly).
mutation rot512-pair-head kernels/kern_rot512.c "check_codecs" \
'            h0 = h0 + 1 == H ? 0 : h0 + 1;' \
'            h0 = k == 0 ? h0 : h0 + 1 == H ? 0 : h0 + 1;'

# The same decoder with a layer's values between its key rows: each pair of rows decodes the
# first row's value groups only (the second row's values never written).
mutation rot512-kv-pair-values kernels/kern_rot512.c "check_codecs check_kernels" \
'                                      ROT_DEC_ROWS * G, out_dtype, bits, nt};' \
'                                      G, out_dtype, bits, nt};'

# The same: the values' slices between the key rows' stages with one slice left out (its
# groups never written; for D = 128 the fourth 4-bit group, or the first four 2-bit ones).
mutation rot512-kv-slice-skipped kernels/kern_rot512.c "check_codecs check_kernels" \
'    if (hi > lo)' \
'    if (hi > lo && slice != 3)'

# The same decoder's exchanges of the 128-bit lanes (lane bits 2 and 3): the second half taken
# with the registers' roles swapped, so channels meet the wrong partners.
mutation rot512-lane-exchange kernels/kern_rot512.c "check_codecs" \
'        y = _mm512_shuffle_f32x4(*a, *b, 0xdd);' \
'        y = _mm512_shuffle_f32x4(*b, *a, 0xdd);'

# ROT's encode's first pass with AVX-512 (kern_rot512.c): the channels' means summed over
# every token but the last (clean sections of D >= 128). Only a CPU with AVX-512 runs it.
mutation rot512-means-token-dropped kernels/kern_rot512.c "check_codecs" \
'                rot_sums16(r, ts, T, lay->dtype, sum, 8, 1);' \
'                rot_sums16(r, ts, T - 1, lay->dtype, sum, 8, 1);'

# The same pass's signs: the seed mixed into the channel index unmixed (kern_rot_neg mixes
# the index, then the seed with it).
mutation rot512-signs-unmixed kernels/kern_rot512.c "check_codecs" \
'        k = rot_mix16(_mm512_xor_si512(seed, rot_mix16(k)));' \
'        k = rot_mix16(_mm512_xor_si512(seed, k));'

# The same pass's Inf/NaN scan: the fourth chain reads the third's halves, so an Inf or NaN
# in every fourth 64-byte line is missed and the section is encoded as clean.
mutation rot512-scan-chain kernels/kern_rot512.c "check_codecs" \
'        m3 = _mm512_max_epu16(m3, _mm512_and_si512(_mm512_loadu_si512(raw + i + 96), mag));' \
'        m3 = _mm512_max_epu16(m3, _mm512_and_si512(_mm512_loadu_si512(raw + i + 64), mag));'

# The AVX-512 value groups' encoder (kern_kivi512.h, KIVI's values and ROT's): the halves'
# integer keys without the inversion of the negative ones, so a group's extremes among
# negative values are the wrong ones. Only a CPU with AVX-512 runs it.
mutation kivi512-hkey-unsigned kernels/kern_kivi512.h "check_codecs check_kernels" \
'    return _mm512_ternarylogic_epi32(h, _mm512_srai_epi16(h, 15), _mm512_set1_epi16(0x7fff), 0x78);' \
'    return _mm512_ternarylogic_epi32(h, _mm512_srai_epi16(h, 15), _mm512_set1_epi16(0), 0x78);'

# The same: the minima's fold pairs tokens 0-7 with tokens 8-15 instead of a token's two
# halves of values.
mutation kivi512-hkey-fold kernels/kern_kivi512.h "check_codecs check_kernels" \
'        kn = _mm512_min_epi16(kn, _mm512_shuffle_i64x2(kn, kn, 0xb1));' \
'        kn = _mm512_min_epi16(kn, _mm512_shuffle_i64x2(kn, kn, 0x4e));'

# The batched decoder's ROT rows, transformed across the lanes of a head row: the upper lane
# of a cross-lane butterfly keeps b - a instead of a - b.
mutation rot-lanes-butterfly-sign kernels/kern_batch.h "check_pack" \
'        x[i] = upper ? KERN_SUB(q[i], x[i]) : KERN_ADD(x[i], q[i]);' \
'        x[i] = upper ? KERN_SUB(x[i], q[i]) : KERN_ADD(x[i], q[i]);'

# The same: the last cross-lane stage left out (the row's halves never meet).
mutation rot-lanes-last-stage kernels/kern_batch.h "check_pack" \
'        for (uint32_t m = 1; m < ro; m <<= 1) {' \
'        for (uint32_t m = 1; m < ro / 2; m <<= 1) {'

# The same, the stage's exchange and butterflies in one phase: each lane reads its partner's
# values as the lanes before it left them, not as the stage found them (the emulation's
# lanes run in turn; on the device, a read of another lane's values without the warp-wide
# exchange).
mutation rot-lanes-one-phase kernels/kern_batch.h "check_pack" \
'            kern_batch_rot_pair(p[i].x, q[i], l & m);' \
'            kern_batch_rot_pair(p[i].x, p[i ^ m].x, l & m);'

# The batched LOWRANK decoder: the rank's factor sigma_i * u[t][i] of term i taken from the
# token's first factor.
mutation lowrank-batch-factor kernels/kern_batch.h "check_pack" \
'                                     kern_batch_ldh(u + 2 * i, sa));' \
'                                     kern_batch_ldh(u, sa));'

# The batched decoder's wide loads (issue 25): a raw section's head row read in accesses as
# wide as the section's address allows, its row stride (2 * head_dim bytes) forgotten: a
# 40-byte row read 16 bytes at a time from an address 8 bytes off (the emulation faults, as
# the device would).
mutation decode-wide-row-stride kernels/kern_batch.h "check_pack" \
'        kern_batch_ld(src, 2 * n, kern_batch_wd(sa | 2 * D, 2 * n), v);' \
'        kern_batch_ld(src, 2 * n, kern_batch_wd(sa, 2 * n), v);'

# The same: an 8-byte access at the wrong offset (the next 8 bytes: q5_1's codes, fp8's).
mutation decode-wide-8-offset kernels/kern_batch.h "check_pack" \
'            memcpy(v + 2 * i, p + 8 * i, 8);' \
'            memcpy(v + 2 * i, p + 8 * i + 8, 8);'

# The contiguity test of the paged moves (issue 25): a layout whose heads are packed but
# whose tokens are padded (one head, a padded row) treated as contiguous: its run steps and
# DMA pieces read and write the padding and miss the tokens after it.
mutation pack-run-strided-tokens kernels/kern_pack.c "check_pack check_e2e_gpu_fake" \
'    return (lay->heads == 1 || eng->head_stride == row) && eng->token_stride == row * lay->heads;' \
'    return lay->heads == 1 || eng->head_stride == row;'

# The same with strides that merely hold a row taken for packed ones: padded heads and
# tokens treated as contiguous.
mutation pack-run-strided-heads kernels/kern_pack.c "check_pack check_e2e_gpu_fake" \
'    return (lay->heads == 1 || eng->head_stride == row) && eng->token_stride == row * lay->heads;' \
'    return (lay->heads == 1 || eng->head_stride >= row) && eng->token_stride >= row * lay->heads;'

# Run steps that ignore where the prefix starts in its page: a step of a prefix starting
# mid-page runs past the page's end into whatever page follows it in memory.
mutation pack-run-crosses-page kernels/kern_pack.c "check_pack" \
'    const uint64_t m = (uint64_t)lay->block_tokens | eng->page_tokens | a->h.off0;' \
'    const uint64_t m = (uint64_t)lay->block_tokens | eng->page_tokens;'

# The decoder's fast rounds never look a later page up: a step whose tokens cross a page
# writes its later tokens past the first page's end.
mutation decode-fast-page-cross kernels/kern_batch.h "check_pack" \
'        kern_batch_tok(f->base, f->rel0, f->slot0, f->page0, f->page_tokens, f->pt_shift,' \
'        kern_batch_tok(f->base, f->rel0, f->slot0, f->page0, 0xffffffffu, f->pt_shift,'

# Decode steps widened whatever the batch's size: a small batch loses its warps to steps of
# more rows (the widening is only for batches with steps to spare).
mutation decode-widen-any-batch kernels/kern_pack.c "check_pack" \
'           b->steps / 2 >= KERN_BATCH_DECODE_SPARE) {' \
'           b->steps / 2 >= 1) {'

# The decoder's KIVI key rounds: a code taken from its neighbour's bits (elements 2i and
# 2i + 1 swapped), and a column's scales converted from the neighbouring channels'.
mutation decode-kivik-swapped-code kernels/kern_batch.h "check_pack" \
'                        kern_kivi_val((c[u] >> (bits * i)) & ((1u << bits) - 1), sc[i], mn[i]),' \
'                        kern_kivi_val((c[u] >> (bits * (i ^ 1))) & ((1u << bits) - 1), sc[i], mn[i]),'

mutation decode-kivik-wrong-channel-scale kernels/kern_batch.h "check_pack" \
'            sc[j] = kern_batch_h2f(kern_batch_e16(v, j));' \
'            sc[j] = kern_batch_h2f(kern_batch_e16(v, j ^ 1));'

# The decode kernel's hint ignored: every batch takes the kernel with the column rounds (a
# q8_0-hinted batch's KIVI keys must not), or none does (an unhinted KIVI batch's must).
mutation decode-hint-always-kivik kernels/kern_pack.c "check_pack" \
'    const uint32_t cols = kern_decode_cols(codecs);' \
'    const uint32_t cols = kern_decode_cols(0 * codecs);'

mutation decode-hint-never-kivik kernels/kern_pack.c "check_pack" \
'    const uint32_t cols = kern_decode_cols(codecs);' \
'    const uint32_t cols = 0 * kern_decode_cols(codecs);'

# The hint's ROT codecs forgotten (a ROT-hinted batch takes the kernel without the ROT key
# rounds), or a KIVI hint taken for ROT too (a KIVI-hinted batch's ROT keys must take the
# generic rounds: that kernel has no ROT key rounds).
mutation decode-hint-rot-forgotten kernels/kern_pack.c "check_pack" \
'    if (codecs == 0 || (codecs & rot))' \
'    if (codecs == 0 || (codecs & rot & 0))'

mutation decode-hint-kivi-with-rot kernels/kern_pack.c "check_pack" \
'        return KERN_BATCH_COLS_KIVI;' \
'        return KERN_BATCH_COLS_KIVI | KERN_BATCH_COLS_ROT;'

# The hint's LOWRANK and MERGE codecs forgotten: such a batch takes the kernel without their
# rounds (check_pack counts the pieces that went by them).
mutation decode-hint-lrm-forgotten kernels/kern_pack.c "check_pack" \
'    return codecs & lrm ? KERN_BATCH_COLS_LRM : 0;' \
'    return codecs & lrm & 0 ? KERN_BATCH_COLS_LRM : 0;'

# A LOWRANK/MERGE-hinted decode not cut to the small parameter block, the only one its kernel
# is built for (its large batches would take kernel 0: the generic rounds).
mutation decode-lrm-small-params kernels/kern_pack.c "check_pack" \
'                (rc == 0 && a->h.nwords > small)) &&' \
'                (rc == 0 && a->h.nwords > small && 0)) &&'

# The decoder's LOWRANK and MERGE rounds: a LOWRANK token's factor u[t][i] read from the
# lane's first token of the step (only steps of several tokens a lane differ), w's rank rows
# read n channels apart instead of head_dim, a MERGE token's own run-start bit left out of
# its row count (so a run's first token takes the previous run's row), a MERGE piece of fewer
# than 8 channels stored whole as its row's bits (16 bytes over the next head's), and every
# token's map word the head's first (blocks of more than 32 tokens differ).
mutation decode-lrm-lowrank-token-factor kernels/kern_batch.h "check_pack" \
'        const uint8_t *ut = uf + 2ull * j * cap;' \
'        const uint8_t *ut = uf + 2ull * jl * cap;'

mutation decode-lrm-lowrank-w-stride kernels/kern_batch.h "check_pack" \
'        for (uint32_t i = 0; i < rank; i++, pw += 2 * D, ps += 4, pu += 2) {' \
'        for (uint32_t i = 0; i < rank; i++, pw += 2 * n, ps += 4, pu += 2) {'

mutation decode-lrm-merge-own-bit kernels/kern_batch.h "check_pack" \
'            const uint32_t r = r0 + kern_batch_popc(e == 31 ? mw : mw & ((2u << e) - 1)) - 1;' \
'            const uint32_t r = r0 + kern_batch_popc(e == 31 ? mw : mw & ((1u << e) - 1)) - 1;'

mutation decode-lrm-merge-same-partial kernels/kern_batch.h "check_pack" \
'    const uint32_t same = b->klay.dtype == b->out_dtype && b->vec == 16 && n == 8;' \
'    const uint32_t same = b->klay.dtype == b->out_dtype && b->vec == 16;'

mutation decode-lrm-merge-first-word kernels/kern_batch.h "check_pack" \
'    const uint32_t mw = kern_batch_ld32(map + 4 * (t0 >> 5), sa);' \
'    const uint32_t mw = kern_batch_ld32(map, sa);'

# The device's fp16 NaN test before its conversion instruction (kern_batch_h8_nan): the
# carry that marks a NaN's magnitude one short (0x7c01, the smallest NaN, taken for a number);
# and a NaN's bits put together quieted (kern_h2f keeps a signalling NaN's bits).
mutation decode-h8-nan-carry kernels/kern_batch.h "check_pack" \
'        c |= (v[j] & 0x7fff7fffu) + 0x03ff03ffu;' \
'        c |= (v[j] & 0x7fff7fffu) + 0x03fe03feu;'

mutation decode-h2f-nan-quieted kernels/kern_batch.h "check_pack" \
'    return kern_u2f((h & 0x8000u) << 16 | 0x7f800000u | (h & 0x3ffu) << 13);' \
'    return kern_u2f((h & 0x8000u) << 16 | 0x7fc00000u | (h & 0x3ffu) << 13);'

# The decoder's ROT key rounds: a code taken from its neighbour's bits (elements 2i and
# 2i + 1 swapped), a column's means or signs from the neighbouring channels', a stage's
# exchange and butterflies in one phase (each lane reading partners the lanes before it had
# already changed), and a lane's second piece of a round the next token instead of tpr on
# (tokens decoded twice, others never).
mutation decode-rotk-swapped-code kernels/kern_batch.h "check_pack" \
'                            ? kern_kivi_val((cd[u][i] >> (rb * e)) & ((1u << rb) - 1), sc, mn)' \
'                            ? kern_kivi_val((cd[u][i] >> (rb * (e ^ 1))) & ((1u << rb) - 1), sc, mn)'

mutation decode-rotk-wrong-channel-mean kernels/kern_batch.h "check_pack" \
'        c->mean[i] = kern_batch_h2f(kern_batch_e16(v, i));' \
'        c->mean[i] = kern_batch_h2f(kern_batch_e16(v, i ^ 1));'

mutation decode-rotk-wrong-channel-sign kernels/kern_batch.h "check_pack" \
'        c->neg |= kern_rot_neg(st->rseed, h, d0 + i) << i;' \
'        c->neg |= kern_rot_neg(st->rseed, h, d0 + (i ^ 1)) << i;'

mutation decode-rotk-one-phase kernels/kern_batch.h "check_pack" \
'                    kern_batch_rot_pair(x[i], q[i], l & m);' \
'                    kern_batch_rot_pair(x[i], x[i ^ m], l & m);'

mutation decode-rotk-second-piece-next-token kernels/kern_batch.h "check_pack" \
'                    const uint32_t j = j0 + l / cpr + u * tpr;' \
'                    const uint32_t j = j0 + l / cpr + u;'

# libkvc never tells the decode its hits' formats: every lossy scatter takes the kernel with
# the KIVI key rounds, whose spills cost the other codecs a sixth of their speed.
mutation libkvc-decode-no-format-hint client/libkvc_gpu.c "check_e2e_gpu_fake" \
'                codecs |= h->format < 32 ? 1u << h->format : 0;' \
'                codecs |= 0;'

# A ggml group whose scale is an fp32 subnormal quantized with 1 / d (infinite products
# converted to integers): the reference's codes differ from the vector encoders'.
mutation ggml-inv-subnormal-d kernels/kern_fmt.h "check_kernels" \
'    return d >= KERN_FP32_MIN_NORMAL ? KERN_DIV(1.0f, d) : 0.0f;' \
'    return d != 0.0f ? KERN_DIV(1.0f, d) : 0.0f;'

# Decode steps of more than one KIVI key group's rows: a step's later tokens decoded with the
# first group's scales and mins, their codes read from past that group's rows.
mutation decode-step-past-kivi-group kernels/kern_pack.c "check_pack" \
'    if ((1u << b->rshift) <= KERN_GROUP)' \
'    if (1)'

# DMA pieces that are not cut at page boundaries: a block spanning two pages goes as one
# piece into the first page and past it.
mutation pack-runs-page-split kernels/kern_pack.c "check_pack check_e2e_gpu_fake" \
'                    const uint64_t b = t0 + T < (pg + 1) * pt ? t0 + T : (pg + 1) * pt;' \
'                    const uint64_t b = t0 + T;'

# A layer range of host hits into packed pages by DMA read from the block's first layer, not
# the first layer of the range.
mutation scatter-direct-layer-offset client/libkvc_gpu.c "check_e2e_gpu_fake" \
'            runs.host[j] = (uint8_t *)h->data + from; /* by DMA into the pages */' \
'            runs.host[j] = (uint8_t *)h->data; /* by DMA into the pages */'

# A staged call in one chunk again: its scratch sized for the whole prefix, not the cap.
mutation stage-one-chunk client/libkvc_gpu.c "check_e2e_gpu_fake" \
'    while (j < n && sum + stage[j] <= cap)' \
'    while (j < n && (sum + stage[j] <= cap || 1))'

# A scratch rounded up (to a power of two) past the staging cap.
mutation stage-scratch-past-cap client/libkvc_gpu.c "check_e2e_gpu_fake" \
'    return cap < top ? cap : top;' \
'    return cap < top ? cap : cap;'

# Host DMA batches in one call again (issue 26): the copies start only once the driver took
# every range.
mutation dma-one-call client/libkvc_gpu.c "check_python" \
'#define KVC_GPU_DMA_FIRST 512' \
'#define KVC_GPU_DMA_FIRST KERN_DMA_BATCH_MAX'

# An arena mapped after kvc_gpu_attach left unregistered: its hits cross from pageable memory.
mutation arena-unregistered-after-attach client/libkvc.c "check_python" \
'    if (mapped && c->gpu_hooks)
        c->gpu_hooks->arena_mapped(c, mapped);' \
'    if (mapped && c->gpu_hooks)
        (void)c->gpu_hooks->arena_mapped;'

# Promotions into the pool started at the lookup again (issue 26): beside the engine's own
# load of the same bytes.
mutation promote-at-lookup daemon/engine.c "check_store_gpu check_e2e_gpu_fake" \
'        tier[hits] = fetched && fetched[hits] ? 0 : s->ix.blocks[idx].tier;
' \
'        tier[hits] = fetched && fetched[hits] ? 0 : s->ix.blocks[idx].tier;
        if (s->gpu && s->ix.blocks[idx].tier == KVC_WIRE_TIER_HOST && o->gpu)
            (void)engine_gpu_move(s, idx, true, now);
'

# A swapped block in the store: a lookup hands out neighbouring hits' locations in pairs.
mutation store-swapped-block daemon/store.c "check_store check_e2e_dedup check_e2e_concurrent" \
'            store_loc_fill(b, &locs[i]);' \
'            store_loc_fill(b, &locs[(i ^ 1) < hits ? (i ^ 1) : i]);'

# The shared index mapped without the huge-page advice, in the daemon and in a reader: at a
# million blocks each hit's bucket and generation cost a page walk that misses (issue 32).
mutation fast-index-daemon-no-huge daemon/fast.c "check_e2e_fast" \
'    (void)madvise(map, bytes, MADV_HUGEPAGE);' \
'    (void)map;'
mutation fast-index-reader-no-huge client/libkvc_fast.c "check_e2e_fast" \
'        (void)madvise(m, bytes, MADV_HUGEPAGE);' \
'        (void)m;'

# 2 MiB pages by collapse (issue 32): a client's arena mapping placed anywhere (its huge pages
# then map as 4 KiB ones), the index's the same, the daemon's arena fault-in that never
# collapses, the index never collapsed.
mutation arena-client-unaligned client/libkvc.c "check_e2e_fast" \
'        void *m = kvc_huge_map(fd, p->arena_bytes, PROT_READ | (w ? PROT_WRITE : 0), populate);' \
'        void *m = mmap((void *)(uintptr_t)((1ull << 44) + 4096), p->arena_bytes, PROT_READ | (w ? PROT_WRITE : 0), MAP_SHARED | populate, fd, 0);'
mutation index-client-unaligned client/libkvc_fast.c "check_e2e_fast" \
'        m = kvc_huge_map(fd, bytes, prot, huge ? 0 : MAP_POPULATE);' \
'        m = mmap((void *)(uintptr_t)((3ull << 43) + 4096), bytes, prot, MAP_SHARED | (huge ? 0 : MAP_POPULATE), fd, 0);'
mutation arena-no-collapse tiers/host.c "check_tier_host check_e2e_fast" \
'        int rc = kvc_huge_collapse((char *)h->map + off);' \
'        int rc = -EAGAIN;'
mutation index-no-collapse daemon/fast.c "check_e2e_fast" \
'        collapse = kvc_huge_collapse((uint8_t *)map + o) == 0;' \
'        collapse = false;'
# The host arenas registered with the device (pinned) ahead of their fault-in: the whole
# arena at the pool's opening, or each part without waiting for the fault-in to be over it.
mutation gpu-reg-at-open daemon/gpu_reg.c "check_store_gpu" \
'    while (idle && ra->next < ra->size && ra->next < r->now_bytes) {' \
'    while (idle && ra->next < ra->size && gpu_reg_chunk(r, ra) == 0) {} while (0) {'
mutation gpu-reg-unfaulted daemon/gpu_reg.c "check_store_gpu" \
'            if (!tier_host_range_faulted(ra->host, ra->next, gpu_reg_len(r, ra))) {' \
'            if (!ra->host) {'
# A client that pins its whole mapping of the arena at its GPU attach, whatever the daemon has
# faulted in (or never pins the rest: the calls after the attach do not catch up).
mutation client-reg-unfaulted client/libkvc_gpu.c "check_e2e_gpu_fake" \
'    uint64_t faulted = kvci_fast_faulted(c, a);' \
'    uint64_t faulted = UINT64_MAX;'
mutation client-reg-no-catch-up client/libkvc_gpu.c "check_e2e_gpu_fake" \
'    if (!g || !g->reg_pending)' \
'    if (g)'

# A LOOKUP that resolves its keys again: the lease finds each hit in the index a second time
# instead of taking the block the lookup found (issue 31: one resolution per key).
mutation lookup-resolves-twice daemon/store.c "check_e2e_fast" \
'            struct block *b = &s->ix.blocks[idx[i]];' \
'            struct block *b = &s->ix.blocks[index_find(&s->ix, (uint16_t)ns_id, &keys[i])];'

# A window's or a state's LOOKUP that resolves its keys again: every step finds each key anew
# instead of taking the block found first (issue 31: one resolution per key, spans too).
mutation span-lookup-resolves-again daemon/store.c "check_e2e_fast" \
'    if (lb->idx[i] == STORE_LOOKUP_UNSEEN)' \
'    if (lb->idx[i] == STORE_LOOKUP_UNSEEN || 1)'

# A leaked pin: releasing a lease leaves its first block pinned.
mutation store-leaked-pin daemon/store.c "check_store check_e2e_crash check_e2e_dedup" \
'    for (uint32_t i = 0; i < h->n; i++)
        store_unpin(s, o, ns, h->blocks[i]);' \
'    for (uint32_t i = 1; i < h->n; i++)
        store_unpin(s, o, ns, h->blocks[i]);'

# An off-by-one in a protocol length check: a batch one entry shorter than its count says
# is accepted (its last entry is read past the datagram).
mutation proto-batch-length-off-by-one daemon/proto.c "check_proto check_e2e_garbage" \
'        if ((uint64_t)h->len != sh->body + (uint64_t)count * sh->entry) {' \
'        if ((uint64_t)h->len < sh->body + (uint64_t)(count - 1) * sh->entry) {'

# A skipped checksum on disk read: the data's XXH3 is never compared.
mutation disk-checksum-skipped tiers/disk_rec.c "check_tier_disk check_e2e_disk" \
'    if (XXH3_64bits(data, h->len) != h->data_csum) {' \
'    if (0 && XXH3_64bits(data, h->len) != h->data_csum) {'

# A wrong byte in the disk tier's read path: a verified raw record's last byte is flipped.
mutation disk-read-wrong-byte tiers/disk_rec.c "check_tier_disk check_e2e_disk" \
'            memcpy(op->dst, op->data_bounce, h->len);
        return;' \
'            memcpy(op->dst, op->data_bounce, h->len);
        ((uint8_t *)op->dst)[h->len - 1] ^= 0x01;
        return;'

# A parent evicted before its child: eviction ignores the child count.
mutation store-evicts-parent daemon/engine.c "check_store check_store_policy check_e2e_pressure" \
'    if (b->children)
        return false;
    return mode == ENGINE_VICTIM_LEAF' \
'    if (0 && b->children)
        return false;
    return mode == ENGINE_VICTIM_LEAF'

# A block in motion is freed: the idle check forgets the moves and jobs in flight.
mutation engine-frees-moving daemon/store.c "check_e2e_engine check_e2e_disk check_quant" \
'           !(b->flags & (BLOCK_F_BUSY | BLOCK_F_LOST));' \
'           !(b->flags & BLOCK_F_LOST);'

# Not inclusive: a promoted block loses its disk record, so it is written again.
mutation engine-promote-drops-record daemon/engine_disk.c "check_e2e_engine" \
'        /* Inclusive: the record stays, so the block is clean in memory. */
        ENGINE_DISK_STAT_ADD(s, ns, promoted_blocks, 1);' \
'        ENGINE_DISK_STAT_ADD(s, ns, promoted_blocks, 1);
        store_lru_unlink(s, idx);
        store_record_free(s, idx);
        store_lru_push_head(s, idx);'

# The wrong arena: a promotion reads into arena 0 whatever the namespace's arena.
mutation engine-promote-arena0 daemon/engine_disk.c "check_e2e_engine" \
'    struct tier *host = s->arenas[ns->arena].tier;
    struct tier_disk_meta m;
    struct engine_disk_move *mv = calloc(1, sizeof(*mv));' \
'    struct tier *host = s->arenas[0].tier;
    struct tier_disk_meta m;
    struct engine_disk_move *mv = calloc(1, sizeof(*mv));'

# A pool move that waits on the loop: the gpu tier's copies ignore their callback and wait
# for the stream (the daemon's copies before issue 18).
mutation gpu-copy-waits tiers/gpu.c "check_tier_gpu check_store_gpu" \
'    if (!done)
        return tier_gpu_copy_sync(g, dst, src, len, kind);' \
'    if (1) {
        rc = tier_gpu_copy_sync(g, dst, src, len, kind);
        if (done)
            done(arg, rc);
        return 0;
    }'

# A demotion handed out ready: lookups name its host slot before the copy has landed.
mutation gpu-demotion-ready-early daemon/engine_gpu.c "check_store_gpu check_e2e_gpu_fake" \
'        b->flags |= BLOCK_F_GPU_MOVING | BLOCK_F_PROMOTING;' \
'        b->flags |= BLOCK_F_GPU_MOVING;'

# A promotion that switches under a lease: the host slot a client still reads is freed.
mutation gpu-promotion-ignores-pins daemon/engine_gpu.c "check_store_gpu" \
'        if (mv->state == ENGINE_GPU_LANDED && !lost && b->pins && !force)
            return false; /* its leases read the host slot: it switches once they are gone */
        b->flags &= (uint8_t)~BLOCK_F_GPU_MOVING;
        if (mv->state == ENGINE_GPU_LANDED && !lost && !b->pins) {' \
'        b->flags &= (uint8_t)~BLOCK_F_GPU_MOVING;
        if (mv->state == ENGINE_GPU_LANDED && !lost) {'

# Keys from an uninitialised hash state (the bug that cost hits): no XXH3_INITSTATE.
mutation key-state-uninitialised client/key.c "check_key" \
'    XXH3_INITSTATE(&st);' \
'    (void)0;'

# The policy's decision ignores pins: a pinned block may be dropped or quantized.
mutation policy-ignores-pins policies/policy_decide.c "check_policy check_store_policy" \
'        if (x->flags & POLICY_BLOCK_PINNED)' \
'        if (0 && (x->flags & POLICY_BLOCK_PINNED))'

# The fast path without slot generations: a freed slot keeps its generation, so a reader of
# the shared index can copy another block's bytes and keep them.
mutation fast-no-generation-bump tiers/host.c "check_e2e_fast" \
'        __atomic_fetch_add(&h->gens[loc->off / h->gen_bytes], 1, __ATOMIC_RELEASE);' \
'        (void)h->gens;'

# A reader that looks up a slot's generation per 4 KiB unit in an index that keeps one per
# granule (the arena's smallest slot): it reads another granule's (or past the table).
mutation fast-gen-per-unit client/libkvc_fast.c "check_e2e_fast" \
'    l->genp = &v->gens[e.unit / v->gen_units];' \
'    l->genp = &v->gens[e.unit];'

# A slot cut smaller than its arena's granule left sharing a generation with the slot before
# it: the index is not replaced, so that block and its neighbour's readers go to the socket.
mutation granule-not-lowered daemon/store.c "check_store" \
'    if (b->arena < s->narenas && b->len && store_round_unit(b->len) < s->arenas[b->arena].gran)' \
'    if (0 && b->arena < s->narenas && b->len && store_round_unit(b->len) < s->arenas[b->arena].gran)'

# The owner map answering for any offset in a granule, not only a slot's start.
mutation slot-owner-any-offset daemon/store.c "check_store" \
'    return b->arena == arena && b->tier == KVC_WIRE_TIER_HOST && b->off == off ? x - 1 : INDEX_NONE;' \
'    return b->arena == arena && b->tier == KVC_WIRE_TIER_HOST ? x - 1 : INDEX_NONE;'

# A commit's publications left for the idle loop alone: a request handled in the same wake-up
# is answered before them, and the client's next read through the index misses its own put.
mutation pub-not-before-next-request daemon/server_dispatch.c "check_e2e_put" \
'    if (rc || r.hdr->opcode != KVC_OP_RESERVE)
        store_pub_flush(sv->store, NULL, NULL);' \
'    if (0)
        store_pub_flush(sv->store, NULL, NULL);'

# A hit ring taken on trust: entries naming namespaces the client may not read are counted.
mutation fast-ring-unvalidated daemon/server_fast.c "check_e2e_fast" \
'            if (server_ns_use(sv, c, h[i].ns, KVC_ACCESS_READ) ||
                store_fast_hit(' \
'            if (store_fast_hit('

# A SYNC that waits for the passes over the rings whatever their share: a client asking for
# room waits, window after window, behind every other client's ring.
mutation fast-sync-waits-behind-others daemon/server_fast.c "check_e2e_fast" \
'        if (spent && c->sync_wait && unread) {' \
'        if (false && spent && c->sync_wait && unread) {'

# A ring whose bit in its uid's bell is never looked at (issue 32): a pass reads only the
# rings it left unread and those of connections without a bell, so a reader's hits reach
# the policy only at the 100 ms sweep, after the eviction that follows them.
mutation fast-bell-never-rung daemon/fast.c "check_e2e_fast" \
'            fn(b->owner[bit], arg);' \
'            (void)fn, (void)arg, (void)bit;'

# An eviction's pass that stops looking at a ring it read empty while its SYNC waits: the
# pass after the batch never comes to it, and the client waits for its answer for ever.
mutation fast-evict-pass-drops-sync daemon/server_fast.c "check_e2e_fast" \
'            if (!unread && c->belled && !c->sync_wait)
                server_fast_active_del(sv, c);
            continue;' \
'            if (!unread && c->belled)
                server_fast_active_del(sv, c);
            continue;'

# Bits of a bell taken as they are: a bit no connection holds (a client may set all 65,536)
# names an owner that is not there.
mutation fast-bell-bits-trusted daemon/fast.c "check_e2e_adversary_fast" \
'        uint64_t x = __atomic_exchange_n(&b->words[w], 0, __ATOMIC_RELAXED) & b->used[w];' \
'        uint64_t x = __atomic_exchange_n(&b->words[w], 0, __ATOMIC_RELAXED);'

# No sweep: a ring whose bit a client of its uid cleared is read only at its connection's
# next request or SYNC.
mutation fast-bell-no-sweep daemon/server_fast.c "check_e2e_adversary_fast" \
'        bool sweep = t - sv->fast_sweep_us >= SERVER_FAST_SWEEP_US;' \
'        bool sweep = t - sv->fast_sweep_us >= SERVER_FAST_SWEEP_US && false;'

# Hits through the index reach the policy only after the batch that evicts: another
# client's puts evict the blocks a reader keeps using.
mutation fast-no-drain-before-evict daemon/server.c "check_e2e_fast" \
'    s->on_evict = server_fast_evict;' \
'    s->on_evict = NULL;
    (void)server_fast_evict;'

# The shared index's inode left at mode 0777: a reader of the arena reopens its read-only
# descriptor read-write through /proc/self/fd (issue 28 row 2).
mutation fast-index-mode-open daemon/fast.c "check_e2e_adversary_fast" \
'    if (fchmod(fd, 0600) < 0 || ftruncate(fd, (off_t)bytes) < 0 ||' \
'    if (ftruncate(fd, (off_t)bytes) < 0 ||'

# The shared index not sealed against later writable mappings: whoever can reopen it
# read-write (root, the daemon's user) maps it writable.
mutation fast-index-unsealed daemon/fast.c "check_e2e_adversary_fast" \
'    if (fcntl(fd, F_ADD_SEALS, (ro ? F_SEAL_FUTURE_WRITE : 0) | F_SEAL_SEAL) < 0)' \
'    if (fcntl(fd, F_ADD_SEALS, (ro ? 0 : 0) | F_SEAL_SEAL) < 0)'

# The daemon reads back what it decided from the shared header (arena_bytes): a writer of
# the header stops every publication.
mutation fast-index-header-trusted daemon/fast.c "check_e2e_adversary_fast" \
'    if (unit >= fi->units || (off & 4095) || lunits >= (1u << 24) || !(k->lo | k->hi))' \
'    if (unit >= (fi->hdr->arena_bytes >> KVC_FAST_UNIT_SHIFT) || (off & 4095) ||
        lunits >= (1u << 24) || !(k->lo | k->hi))'

# Hit rings read without a cap: every pass reads all a ring holds, whatever the rate
# (issue 28 row 4: one tenant's flood slowed every other one's lookups 200-1,000 times).
mutation fast-ring-drain-uncapped daemon/fast.c "check_e2e_fast check_e2e_adversary_fast" \
'    if (max > allow)
        max = allow;' \
'    (void)allow;
    max = KVC_FAST_RING_ENTS;'

# Hit rings read a whole ring at a time (before each request, and in passes without a size
# or time bound), at server.fast_ring_rate still.
mutation fast-ring-steps-unbounded daemon/server_int.h "check_e2e_fast check_e2e_adversary_fast" \
'#define SERVER_FAST_REQ 64u
#define SERVER_FAST_CHUNK 16u
#define SERVER_FAST_PASS_ALL 512u
#define SERVER_FAST_PASS_US 200u' \
'#define SERVER_FAST_REQ 4096u
#define SERVER_FAST_CHUNK 4096u
#define SERVER_FAST_PASS_ALL (1u << 20)
#define SERVER_FAST_PASS_US 1000000u'

# Ring entries count as requests: a connection that only writes its ring never idles out.
mutation fast-ring-keeps-idle daemon/server_fast.c "check_e2e_adversary_fast" \
'    n = fast_ring_take(c->ring, h, max, &lied);' \
'    n = fast_ring_take(c->ring, h, max, &lied);
    c->t_last = now;'

# Copy times taken on trust: RELEASE and ring entries drive load_us where they like.
mutation load-us-unbounded daemon/server_dispatch.c "check_e2e_adversary_fast" \
'    uint64_t ok = us < c->load_credit_us ? us : c->load_credit_us;' \
'    uint64_t ok = us;'

# A namespace found on disk at start is placed in arena 0 whatever its access lists say.
mutation restored-ns-arena0 daemon/main.c "check_e2e_adversary" \
'    int rc = acl_ns_open(d->acl, l, ns_id, created);' \
'    int rc = store_ns_open(d->store, l, ns_id, created);'

# The precision ladder: a step down leaves its rung's bytes uncounted at the new rung (the
# decision then works from wrong shares).
mutation ladder-rung-bytes daemon/quant.c "check_ladder" \
'    b->format = j->format;
    store_ladder_account(s, j->idx, +1);' \
'    b->format = j->format;'

# host.quantize_threads ignored: one encoding thread whatever the option says.
mutation quant-one-thread daemon/quant.c "check_quant" \
'    for (uint32_t i = 0; i < quant_threads(s->p.quantize_threads); i++) {' \
'    for (uint32_t i = 0; i < 1; i++) {'

# The precision ladder: a sink at the cold end of the raw rung is quantized instead of
# leaving the tier.
mutation ladder-sink-quantized daemon/engine.c "check_ladder" \
'        if (v != INDEX_NONE && s->ix.blocks[v].depth == 0 && !s->ix.blocks[v].children)' \
'        if (v != INDEX_NONE && s->ix.blocks[v].depth == 0 && s->ix.blocks[v].children > 99)'

# VATP over a disk tier: a raw block's disk write does not measure its value norms (only the
# quantize pass would, and a namespace without codecs never meets it).
mutation vatp-no-disk-norms daemon/engine_disk.c "check_e2e_policy" \
'                               mv->peek ? engine_disk_peek : NULL, engine_disk_write_encoded, mv);' \
'                               ((void)engine_disk_peek, NULL), engine_disk_write_encoded, mv);'

# Per-head budgets: the full heads get the plain budget, not what the sink-only and local
# heads leave of budget x heads.
mutation budget-heads-even daemon/store_policy.c "check_e2e_policy" \
'    b = nfull ? (total - spent) / nfull : cl;' \
'    b = nfull ? (total - spent) / lh : cl;'

# Head profiles: the per-head masses are halved but the count of hinted blocks is not, so
# after the first halving every later hint halves them again (the profile forgets at once).
mutation head-profile-age-count daemon/store_policy.c "check_quant" \
'            ns->head_seen /= 2;' \
'            ns->head_seen = STORE_HEAD_AGE_BLOCKS;'

# host.head_step: a sink block's sink-only heads would take the second codec too.
mutation head-step-sinks daemon/store_policy.c "check_quant" \
'    uint32_t sinks = ns->pp.sinks > 1 ? ns->pp.sinks : 1;' \
'    uint32_t sinks = 0;'

# host.head_step: never taken.
mutation head-step-never daemon/quant.c "check_quant" \
'            if (to != format) {' \
'            if (to != format && 0) {'

# The precision ladder: the namespace's fidelity budget is not applied to its rungs.
mutation ladder-budget-ignored daemon/store_policy.c "check_ladder" \
'                    (ns->max_error > 0 &&
                     kern_codec_attn_error((enum kern_codec)c) > ns->max_error))' \
'                    (ns->max_error < 0))'

# The ghost table's floor compared against its first size (issue 30): a 64 MiB arena of 64 KiB
# blocks keeps 4,096 ghosts, half the window of cache.ghosts = 8, as before the floor.
mutation ghost-floor-ignored daemon/store_policy.c "check_store_policy" \
'        s->ghost_cap = (uint32_t)(cap < STORE_GHOST_FLOOR ? STORE_GHOST_FLOOR' \
'        s->ghost_cap = (uint32_t)(cap < STORE_GHOST_MIN ? STORE_GHOST_FLOOR'

# The precision ladder over a disk tier: the trim drops clean memory copies instead of
# stepping the ladder (the ladder never holds its rungs where a disk tier is configured).
mutation ladder-not-in-disk-trim daemon/engine_disk.c "check_e2e_quant" \
'                    s->core->ladder_evict(s, a, v, (uint64_t)((double)used - low) + 1, now);' \
'                    ENGINE_LADDER_NONE;'

# The precision ladder over a disk tier: the LRU-tail quantize walk also takes blocks of a
# namespace that keeps a ladder (sinks among them, out of the ladder's order).
mutation quant-walk-over-ladder daemon/quant.c "check_e2e_quant" \
'            bool ladder = ns->rungs >= 2 && ns->policy != POLICY_LRU;' \
'            bool ladder = false;'

# The remote tier: a block stored in one value (every block up to remote.part_size) whose
# bytes are not checked against its checksum.
mutation remote-one-value-unchecked tiers/remote.c "check_e2e_remote" \
'            rc = q->sealed ? remote_part_open(p)
                           : remote_rec_check_data(p->xxh,' \
'            rc = q->sealed ? remote_part_open(p)
                 : q->geom.count == 1 ? 0
                           : remote_rec_check_data(p->xxh,'

# A sealed part's data taken whatever its tag says (the plaintext checksum still stands
# behind it, but a forged part must be refused as not sealed under the key).
mutation remote-seal-tag-ignored tiers/remote.c "check_e2e_remote" \
'    int rc = remote_seal_open_data(p->sealed, p->hdr, &q->seal, at, len, p->tag);' \
'    int rc = (remote_seal_open_data(p->sealed, p->hdr, &q->seal, at, len, p->tag), 0);'

# A sealed header not bound to the part's index: a part sealed for one place opens in
# another.
mutation remote-seal-index-unbound tiers/remote_seal.c "check_remote_rec check_e2e_remote" \
'    remote_seal_put32(p, index);' \
'    remote_seal_put32(p, index & 0);'

# A secret shown: config_get writes a SECRET option's value.
mutation config-secret-shown daemon/config.c "check_config" \
'    case CONFIG_TYPE_SECRET: snprintf(buf, len, "%s", *v->s ? CONFIG_SECRET_SET : ""); break;' \
'    case CONFIG_TYPE_SECRET: snprintf(buf, len, "%s", v->s); break;'

# Placement and access options shown to anyone through CONFIG_GET.
mutation config-get-not-admin-only daemon/admin.c "check_e2e_remote" \
'    return config_option_access(o) == CONFIG_ACCESS_ANYONE || admin_all(x);' \
'    return o != NULL || admin_all(x);'

# A namespace with access lists on the remote tier although its section does not say so.
mutation remote-restricted-by-default daemon/config_ns.c "check_config check_e2e_remote" \
'        return ns->remote == 1 && sealed;' \
'        return (void)sealed, ns->remote != 0;'

# A key skipped at RESERVE without its counter: a put whose parent was evicted leaves no trace
# (issue 28: 9,871 of 110,803 keys).
mutation put-skip-uncounted daemon/store.c "check_e2e_put" \
'            if (prev == INDEX_NONE)
                STORE_STAT_ADD(s, ns, skipped_parent_blocks, n);' \
'            if (prev == INDEX_NONE)
                (void)0;'

# A chain reserved under a parent that another client is still writing (not committed): the
# keys hang from a block that may never be, and one tenant's put from another's.
mutation put-parent-unwritten-reserved daemon/store.c "check_store check_e2e_put" \
'        } else if (!cached && (prev == INDEX_NONE || !store_resv_holding(s, o, prev))) {' \
'        } else if (!cached && (prev == INDEX_NONE || (!store_resv_holding(s, o, prev) && 0))) {'

# A chunk refused under its own client's uncommitted chunk (issue 26): the next chunk of a
# prompt waits for the last one's commit again.
mutation chain-own-parent-refused daemon/store.c "check_store check_e2e_put" \
'        } else if (!cached && (prev == INDEX_NONE || !store_resv_holding(s, o, prev))) {' \
'        } else if (!cached && (prev == INDEX_NONE || !store_resv_holding(s, o, prev) || 1)) {'

# A chain committed before the reserved block it hangs from: a committed block whose parent
# is invisible (and may never be).
mutation chain-commit-before-parent daemon/store.c "check_store check_e2e_put" \
'    if (ncommit && h->n && h->parent_pin != INDEX_NONE &&' \
'    if (0 && ncommit && h->n && h->parent_pin != INDEX_NONE &&'

# The reservations hanging from an aborted one keep their slots: keys reserved (busy for
# every other writer) under a block that is gone.
mutation chain-orphan-kept daemon/store.c "check_store check_e2e_put" \
'    if (s->ix.blocks[idx].pins)
        store_resv_orphan(s, o, idx);' \
'    if (0 && s->ix.blocks[idx].pins)
        store_resv_orphan(s, o, idx);'

# A quiet COMMIT refused before its parent is kept: nobody commits it, its keys stay busy
# until the reservation times out.
mutation chain-quiet-commit-kept daemon/server_dispatch.c "check_e2e_put" \
'    if (n == -EAGAIN && !(q->flags & KVC_COMMIT_F_QUIET))' \
'    if (n == -EAGAIN)'

# The trim a RESERVE calls for waits for its COMMIT (or the tick): a stream of puts into a full
# arena evicts at every RESERVE while the client waits.
mutation trim-after-commit-only daemon/server_dispatch.c "check_e2e_put" \
'    if (r.hdr && (r.hdr->opcode == KVC_OP_COMMIT || r.hdr->opcode == KVC_OP_RESERVE))' \
'    if (r.hdr && r.hdr->opcode == KVC_OP_COMMIT)'

# The wait for a writer taken for any user's reservation: another tenant's held slots stall a
# user's puts of the same prefix for disk.put_wait each.
mutation writer-wait-any-uid daemon/server_dispatch.c "check_e2e_adversary" \
'        if (w != c && w->u == c->u && store_resv_holds(sv->store, &w->owner, idx)) {' \
'        if (w != c && store_resv_holds(sv->store, &w->owner, idx)) {'

# A RESERVE that waits for room is counted at every try (reserve_keys many times the keys put).
mutation put-wait-counted-twice daemon/server_dispatch.c "check_e2e_disk" \
'         * one piece (a chain cut at NOSPACE loses its tail for good). */
        if (resv)
            store_abort(sv->store, &c->owner, resv);
        server_resv_stats_restore(&sv->store->total, &tot0);' \
'         * one piece (a chain cut at NOSPACE loses its tail for good). */
        if (resv)
            store_abort(sv->store, &c->owner, resv);
        (void)tot0;'

# Two daemons on one disk file: the lock is not taken.
mutation disk-lock-not-taken tiers/disk.c "check_tier_disk_open check_e2e_disk" \
'    if (rc == 0)
        rc = tier_disk_lock(d, i);' \
'    if (0)
        rc = tier_disk_lock(d, i);'

# The walk at start stops at the end of a page's first window of headers.
mutation disk-walk-stops-at-window tiers/disk_walk.c "check_tier_disk" \
'            return got == c->want; /* past the window: read on, unless the read came short */' \
'            return false;'

# The first checkpoint waits for the interval (a crash in the first minute walks every page).
mutation disk-checkpoint-first-late tiers/disk_ckpt.c "check_tier_disk_open" \
'    if (!d->ckpt_tried && d->st.used)
        return true;' \
'    if (0 && !d->ckpt_tried && d->st.used)
        return true;'

# The Python binding: a lossy hit viewed at the raw block size (its view covers the slots
# after it, and can reach past the arena's mapping).
mutation python-view-block-bytes python/kvcd/_kvcd_lease.c "check_python" \
'    if (PyBuffer_FillInfo(view, self, p, (Py_ssize_t)len, h->kind == HANDLE_KIND_LEASE, flags) < 0)' \
'    if (PyBuffer_FillInfo(view, self, p, (Py_ssize_t)h->block_bytes, h->kind == HANDLE_KIND_LEASE, flags) < 0)'

# The Python binding: the namespace not checked again after the tokens' __index__ ran (one
# that closed the client leaves keys_from_tokens reading a freed namespace).
mutation python-ns-unchecked-after-python python/kvcd/_kvcd_ns.c "check_python" \
'    if (ns_check(ns) < 0)
        goto out;
    maxkeys =' \
'    maxkeys ='

# The Python binding: a closed Client may be initialised again (its old namespaces then
# meet the new connection).
mutation python-reinit-after-close python/kvcd/_kvcd_client.c "check_python" \
'    if (c->conn) {' \
'    if (c->c) {'


# Hybrid kinds: a state lookup answered from the keys' leading run (a state taken at another
# boundary, or none where one is cached).
mutation kinds-state-from-run daemon/store.c "check_e2e_kinds" \
'        for (end = n; end > 0 && !store_key_cached(s, ns_id, keys, lb, end - 1, mode); end--)' \
'        for (end = store_lookup_run(s, ns_id, keys, n, NULL); end > 0 && !store_key_cached(s, ns_id, keys, lb, end - 1, mode); end--)'

# Hybrid kinds: a window lookup that ends at the first gap (the blocks before a window are
# required again).
mutation kinds-window-needs-whole-prefix daemon/store.c "check_e2e_kinds" \
'        run = store_key_cached(s, ns_id, keys, lb, i, mode) ? run + 1 : 0;' \
'        run = store_key_cached(s, ns_id, keys, lb, i, mode) && run == i ? run + 1 : 0;'

# Hybrid kinds: window blocks chained to their parents (the blocks behind a window kept alive
# as parents, the window's own tip evicted first).
mutation kinds-window-chained daemon/store.c "check_e2e_kinds" \
'        if (ns->layout.kv_kind == KVC_WIRE_KV_KIND_KV_WINDOW) {
            /* Every block' \
'        if (0) {
            /* Every block'

# kvcd.sglang: batch_exists waits for disk reads in SGLang's prefetch thread.
mutation sglang-exists-waits python/kvcd/sglang.py "check_python" \
'                with self._ns(m, s).lookup(kb[done:done + n], ready_only=True) as lease:' \
'                with self._ns(m, s).lookup(kb[done:done + n]) as lease:'

# Hybrid kinds: a window whose remote read failed handed out cut (what is left of it is no
# prefix's window) instead of asked again.
mutation kinds-remote-cut-window client/libkvc_lease.c "check_e2e_remote" \
'        } else if (span && l->n < asked) {' \
'        } else if (span && l->n < asked && 0) {'

# Hybrid kinds: a window or a state served from the shared index as a run from keys[0].
mutation kinds-fast-run client/libkvc_fast.c "check_e2e_fast" \
'    const struct kvc_fastview *v = n && run ? kvc_fast_view_of(ns) : NULL;' \
'    const struct kvc_fastview *v = n && (run || 1) ? kvc_fast_view_of(ns) : NULL;'

# A block's hint mass past FLT_MAX made infinite (it never decays: the block first forever).
mutation policy-hint-unsaturated policies/policy.c "check_policy" \
'    b->hint = h < FLT_MAX ? (float)h : FLT_MAX;' \
'    b->hint = (float)h;'

# Issue 30: the half-life tuner's hysteresis gone: any lead, however small against the
# standard error of the two candidates' difference, moves the choice (near-tied counts that
# cross flip it, as the order of a few lookups decides).
mutation tune-no-margin policies/policy_tune.c "check_policy" \
'        if (t->hits[top] - t->hits[t->best] > POLICY_TUNE_MARGIN * sqrt(t->split[a][b]))' \
'        if (t->hits[top] - t->hits[t->best] > 0 * sqrt(t->split[a][b]))'

# Issue 30: the tuner's ends of the grid not interpolated (the last candidate's own half-life,
# twice what the one before it gives when the two are tied).
mutation tune-edge-not-interpolated policies/policy_tune.c "check_policy" \
'        int k = b < 2 ? 2 : b > POLICY_TUNE_CANDIDATES - 2 ? POLICY_TUNE_CANDIDATES - 2 : b;' \
'        int k = b < 2 ? 2 : b > POLICY_TUNE_CANDIDATES - 2 ? POLICY_TUNE_CANDIDATES - 2 : b;
        if (k != b)
            return t->h[b];'

# HINT_HEADS: scores above KVC_PROTO_MAX_HINT_SCORE taken (summed into the head masses they
# make them infinite, and the namespace's head profiles fixed for good).
mutation hint-heads-score-unbounded daemon/proto.c "check_proto" \
'            if (!isfinite(v[i]) || v[i] < 0 || v[i] > KVC_PROTO_MAX_HINT_SCORE) {' \
'            if (!isfinite(v[i]) || v[i] < 0) {'

# The fast path's one key ahead: the entry read ahead never becomes the one copied (every
# block of a run gets the first one's bytes).
mutation fast-ahead-keeps-first client/libkvc_fast.c "check_e2e_fast" \
'        cur = nxt;' \
'        (void)nxt;'

# The fast path's one key ahead: the next key looked up in the buckets of the key after it.
mutation fast-ahead-wrong-buckets client/libkvc_fast.c "check_e2e_fast" \
'            next = kvc_fast_entry(ns, v, &keys[hits + 1], bq[(hits + 1) & 1], &nxt, base);' \
'            next = kvc_fast_entry(ns, v, &keys[hits + 1], bq[hits & 1], &nxt, base);'

# The fast path's one key ahead: a key found missing ahead does not end the run (the block
# after a miss is served from a stale entry).
mutation fast-ahead-past-miss client/libkvc_fast.c "check_e2e_fast" \
'        have = next;' \
'        have = have || next;'

# Hybrid kinds: a READY_ONLY span lookup by a client that cannot read the GPU pool never
# starts the copies of the span's pool blocks (it answers nothing, forever).
mutation kinds-pool-ready-only-no-move daemon/engine.c "check_e2e_gpu_fake" \
'        for (uint32_t i = 0; s->gpu && !o->gpu && i < count; i++)' \
'        for (uint32_t i = 0; s->gpu && !o->gpu && i < count && !count; i++)'

# Issue 25: a lookup of a client without the pool flag stops at the pool's 64 moves in
# flight and answers the rest of the prefix as a miss (it does not wait for slots to free).
mutation gpu-host-lookup-no-wait daemon/engine.c "check_e2e_gpu_fake" \
'                moves_full = mrc == -EAGAIN;' \
'                moves_full = false;'

# The same: a NOWAIT lookup held for the pool's moves like one that waits.
mutation gpu-host-lookup-nowait-waits daemon/server_dispatch.c "check_e2e_gpu_fake" \
'    bool wait_ok = may_wait && !(q->flags & (KVC_LOOKUP_F_READY_ONLY | KVC_LOOKUP_F_NOWAIT));' \
'    bool wait_ok = may_wait && !(q->flags & KVC_LOOKUP_F_READY_ONLY);'

# The batched decoder takes a raw-head appendix of no heads as present: its slot table is
# read wherever the block's header says, past the block's end too.
mutation batch-rawh-empty-kept kernels/kern_batch.h "check_pack" \
'    if (o->rh && (o->rcnt == 0 || o->rh + kern_rawh_bytes(lay, o->rcnt) > src_len))' \
'    if (o->rh && o->rh + kern_rawh_bytes(lay, o->rcnt) > src_len)'

# A waiting lookup that started pool moves keeps its place ahead of the others waiting: a
# long prefix takes every slot a landing frees while the short lookup behind it waits.
mutation gpu-retry-took-keeps-place daemon/server_dispatch.c "check_e2e_gpu_fake" \
'        if (engine_gpu_moves_started(sv->store) != moves0) {' \
'        if (false && engine_gpu_moves_started(sv->store) != moves0) {'

# A quantize landing holds every uid's waiting puts behind the first that still does not fit,
# not each uid's behind its own: another tenant's put that the landing made room for waits for
# the tick.
mutation landing-hold-every-uid daemon/server_dispatch.c "check_e2e_quant" \
'            behind = p->c && p->c->u == held[i];' \
'            behind = p->c && held[i];'

# A new RESERVE takes the room free now while an older one of its uid waits for that arena's
# room: the newest of a tenant's puts is served first, the waiting one after it.
mutation put-not-behind-own-uid daemon/server_dispatch.c "check_e2e_quant" \
'    if (may_wait && server_reserve_behind(sv, c, ns, now)) {' \
'    if (false && may_wait && server_reserve_behind(sv, c, ns, now)) {'

# Issue 30: a RESERVE whose first key not committed another client of its uid is writing is
# answered BUSY at once again, not made to wait for that commit: the chain's tail is skipped.
mutation put-writing-not-waited daemon/server_dispatch.c "check_e2e_dedup" \
'    if (may_wait && memchr(sv->st, KVC_WIRE_SLOT_BUSY, want) &&' \
'    if (false && may_wait && memchr(sv->st, KVC_WIRE_SLOT_BUSY, want) &&'

# Issue 30: the key a waiting RESERVE waits for is looked for at the chain's first key only,
# not past the committed ones: a chain whose writer holds a later key is answered BUSY.
mutation reserve-writing-first-key daemon/store.c "check_store check_e2e_dedup" \
'        if (b->state != BLOCK_STATE_COMMITTED || (b->flags & BLOCK_F_LOST))
            return INDEX_NONE;
    }
    return INDEX_NONE;' \
'        return INDEX_NONE;
    }
    return INDEX_NONE;'

# Issue 32: a trim no longer stops for a waiting request (the loop's poll is never asked):
# a put behind a commit's trim waits for its first 256 evictions.
mutation trim-yield-ignored daemon/engine.c "check_store" \
'    if (!spent && s->trim_yield && acted >= s->trim_yield_next) {' \
'    if (false && s->trim_yield && acted >= s->trim_yield_next) {'

# Issue 32: a namespace's opening no longer sizes the key map for the arena: it doubles (and
# is rebuilt on the loop) as the blocks come.
mutation index-reserve-skipped daemon/store.c "check_store" \
'    store_index_reserve(s);' \
'    (void)store_index_reserve;'

# Issue 26/32: a hit's touch republishes its unchanged entry in the shared index again (a
# probe of the index a hit, after the reply); or never retries a block the index once had no
# room for.
mutation touch-republishes daemon/store.c "check_store" \
'    else if (!s->fast_keep || (fi && fast_index_lost_any(fi)))' \
'    else if (fi || !s->fast_keep)'
mutation touch-never-retries daemon/store.c "check_store" \
'    else if (!s->fast_keep || (fi && fast_index_lost_any(fi)))' \
'    else if (!s->fast_keep || (fi && false))'

# A lookup's probes ahead resolve a key with the hash of the key after it.
mutation index-ahead-wrong-hash daemon/index.c "check_index" \
'    return index_probe_hashed(ix, a->ns, &a->keys[i], a->h[i % INDEX_AHEAD_RING]);' \
'    return index_probe_hashed(ix, a->ns, &a->keys[i], a->h[(i + 1) % INDEX_AHEAD_RING]);'

# The key map's slots are no longer marked for huge pages (killed where the kernel has
# transparent huge pages; the test says so and checks nothing where it has none).
mutation index-huge-pages-skipped daemon/index.c "check_index" \
'        (void)madvise((void *)a, e - a, MADV_HUGEPAGE);' \
'        (void)a;'

# Issue 26: a lookup's policy work kept past its reply is never applied by the loop's pause
# after it (the tuner and the hits' accesses wait for the next request).
mutation post-flush-after-reply daemon/server_dispatch.c "check_e2e_gpu_fake" \
'    store_post_flush(arg);' \
'    (void)arg;'

# Issue 26: a lookup's policy work applied right after its reply, with no pause of the loop
# first (a reply's reader on the daemon's CPU waits for the tuner).
mutation post-pause-skipped daemon/server_dispatch.c "check_e2e_gpu_fake" \
'        loop_pause(sv->loop, SERVER_POST_PAUSE_US, server_post_flush, sv->store);' \
'        server_post_flush(sv->store);'

# Every lookup pauses the loop, however short (its sleep and wake cost more than its work).
mutation post-pause-short-lookups daemon/server_dispatch.c "check_e2e_gpu_fake" \
'sv->store->post_nkey >= SERVER_POST_PAUSE_KEYS)' \
'sv->store->post_nkey >= 1)'

# The loop's paused work run after the handlers of the events its wait returned, not before.
mutation loop-pause-after-handlers daemon/loop.c "check_loop" \
'        if (l->pause_fn) /* before any handler, `after` or tick */' \
'        if (l->pause_fn && n <= 0) /* before any handler, `after` or tick */'

# The paused work asked by a handler left for after a tick due in the same iteration.
mutation loop-pause-not-before-tick daemon/loop.c "check_loop" \
'            if (l->pause_fn) /* asked by a handler of this batch: before the tick too */' \
'            if (!l) /* asked by a handler of this batch: before the tick too */'

# The pause sleeps until the tick (or an event), not a moment.
mutation loop-pause-until-tick daemon/loop.c "check_loop" \
'        if (l->pause_fn && timeout > 0) {' \
'        if (l->pause_fn && timeout < 0) {'

# A newer lookup drops the policy work an earlier one left instead of applying it first.
mutation post-earlier-lookup-first daemon/store.c "check_store_policy" \
"    store_post_flush(s); /* an earlier lookup's first */" \
"    s->post_ns = 0; /* an earlier lookup's first */"

# A deferred lookup's work applied to whatever namespace now has its id (dropped and opened
# again before the flush): another tenant's blocks in the freed indexes counted as hit.
mutation post-flush-no-serial daemon/store.c "check_store_policy" \
"    if (ns && ns->serial == s->post_serial) /* pinned hits: still these blocks */" \
"    if (ns) /* pinned hits: still these blocks */"

# The KIVI key rounds read a raw head's rows for a slot past the appendix's count (a hostile
# slot table: rows past the block's end).
mutation decode-kivik-raw-slot-past-count kernels/kern_batch.h "check_pack" \
'             * 2TD-byte multiples) */
            uint32_t v[4];
            kern_batch_ld(st->src + st->hs.rh + 2 * ((uint64_t)st->lg * b->heads + h), 2,
                          kern_batch_wd(kern_batch_dra(st), 2), v);
            const uint32_t slot = v[0];
            if (slot && slot <= st->hs.rcnt) {' \
'             * 2TD-byte multiples) */
            uint32_t v[4];
            kern_batch_ld(st->src + st->hs.rh + 2 * ((uint64_t)st->lg * b->heads + h), 2,
                          kern_batch_wd(kern_batch_dra(st), 2), v);
            const uint32_t slot = v[0];
            if (slot && slot <= st->hs.rcnt + 2) {'

# Hybrid kinds: a long window lookup whose requests do not overlap by the window (a window
# straddling two requests is judged by neither).
mutation kinds-long-no-overlap client/libkvc_lease.c "check_e2e_kinds" \
'            end = at + w - 1;' \
'            end = at + 0 * w;'

# The encode kernel's fp8 unit (issue 25): the first fold's thread t takes threads t .. t + 15,
# not 16 t .. 16 t + 15, so the amax of threads 31..255's values never reaches the scale.
mutation enc-fp8-fold-stride kernels/kern_encb.h "check_kernels check_codecs" \
'    const float *in = step == 1 ? sm->red + KERN_ENC_FP8_FOLD * tid : sm->id;' \
'    const float *in = step == 1 ? sm->red + tid : sm->id;'

# The encode kernel's token-major units, whole groups (head_dim a multiple of 32, aligned):
# a unit's first group found 32 u0 bytes into the section, not 64 u0 (group u starts 64 u
# bytes in).
mutation enc-tm-whole-unit-offset kernels/kern_encb.h "check_kernels" \
'        kern_enc_tm_fast(codec, lay->dtype, raw + 2 * KERN_GROUP * u0, sm->u.out, gb, ng, tid, nt);' \
'        kern_enc_tm_fast(codec, lay->dtype, raw + KERN_GROUP * u0, sm->u.out, gb, ng, tid, nt);'

# The same: a group's encoding into shared memory without its 2-byte tail (q8_0's last two
# codes, where its 34 bytes start 4-byte aligned).
mutation enc-tm-put-tail kernels/kern_encb.h "check_kernels" \
'    if ((gb - b) & 2) {' \
'    if ((gb - b) & 1) {'

# The encode kernel's header unit, its section table a thread an entry: entries 16 bytes
# apart, not sizeof(struct kern_block_sect) (12).
mutation enc-hdr-entry-stride kernels/kern_encb.h "check_kernels" \
'        memcpy(dst + tbl + i * sizeof(e), &e, sizeof(e));' \
'        memcpy(dst + tbl + i * 16, &e, sizeof(e));'

# The encode kernel's KIVI key units (columns of 8 channels over slices of tokens): the
# slices' minima folded keeping the later slice's on a tie, so a channel whose minimum is -0
# first and +0 later (in another slice) gets +0's fp16 min.
mutation enc-kk-fold-ties kernels/kern_encb.h "check_codecs" \
'            mn = vn < mn ? vn : mn;' \
'            mn = vn <= mn ? vn : mn;'

# The same within a slice: a slice's min keeps its later token's zero on a tie.
mutation enc-kk-slice-ties kernels/kern_encb.h "check_codecs" \
'                mn[k] = x[k] < mn[k] ? x[k] : mn[k];' \
'                mn[k] = x[k] <= mn[k] ? x[k] : mn[k];'

# The same: each slice's last token left out of its min and max.
mutation enc-kk-slice-end kernels/kern_encb.h "check_kernels check_codecs" \
'        const uint32_t r1 = rows < r0 + per ? rows : r0 + per;' \
'        const uint32_t r1 = rows < r0 + per ? rows : r0 + per - 1;'

# The same: a column's codes placed 4 bytes a column in its row, right for 4 bits only.
mutation enc-kk-column-offset kernels/kern_encb.h "check_kernels check_codecs" \
'        uint8_t *o = g + 4 * D + r * rb + j * (uint32_t)bits;' \
'        uint8_t *o = g + 4 * D + r * rb + j * 4u;'

# The same: a last column of fewer than 8 channels stores its whole bytes only (head_dim 7:
# the 4th byte at 4 bits, the 2nd at 2 bits lost).
mutation enc-kk-part-column-bytes kernels/kern_encb.h "check_codecs" \
'            for (uint32_t b = 0; b < (n * (uint32_t)bits + 7) / 8; b++)' \
'            for (uint32_t b = 0; b < n * (uint32_t)bits / 8; b++)'

# The same, the 16-byte moves through shared memory: a column's upper 4 maxima stored from
# its lower 4, and in phase 2 its reciprocals read from its mins.
mutation enc-kk-part-store kernels/kern_encb.h "check_kernels check_codecs" \
'            KERN_BATCH_STORE(kern_batch_v16, ox + 4, q[3]);' \
'            KERN_BATCH_STORE(kern_batch_v16, ox + 4, q[2]);'
mutation enc-kk-param-load kernels/kern_encb.h "check_kernels check_codecs" \
'            memcpy(i8, q + 2, 32);' \
'            memcpy(i8, q, 32);'

# The encode kernel's ROT rows: the cross-chunk stages one length off (each pairs a value
# with the one 2 len away, the last one with the next row's).
mutation enc-rot-cross-stage kernels/kern_encb.h "check_codecs" \
'        const uint32_t ll = kern_enc_log2(L) + step - 1, len = 1u << ll;' \
'        const uint32_t ll = kern_enc_log2(L) + step, len = 1u << ll;'

# The same, the in-chunk stages stopping one short (lengths 1 .. L / 4 in registers).
mutation enc-rot-chunk-stages kernels/kern_encb.h "check_codecs" \
'            kern_fwht(y, L);' \
'            kern_fwht(y, L / 2);'

# The encode kernel's LOWRANK search: the emulation's fold of a Gram-Schmidt step adding,
# in a round, the values other lanes already changed in that round (a shuffle reads the other
# lane's register as the round found it; here lane 1 adds lane 0's new sum).
mutation enc-lr-fold-in-place kernels/kern_encb.h "check_codecs" \
'            w[m] = KERN_ADD(v[m], v[m ^ r]);
        memcpy(v, w, sizeof(v));' \
'            v[m] = KERN_ADD(v[m], v[m ^ r]);
        memcpy(w, v, sizeof(v));'

# The same: a lane's partial over its elements in the other order (the same sum in exact
# arithmetic, rounded in another order than kern_sum8's).
mutation enc-lr-partial-order kernels/kern_encb.h "check_codecs" \
'        if (m + 8 * i < n)
            p = KERN_ADD(p, KERN_MUL(y ? y[m + 8 * i] : x[i], x[i]));' \
'        if (m + 8 * (7 - i) < n)
            p = KERN_ADD(p, KERN_MUL(y ? y[m + 8 * (7 - i)] : x[7 - i], x[7 - i]));'

# The same: a projection reading the next lane's elements of V_j (on the device a read of
# what another thread wrote, with no barrier between the steps).
mutation enc-lr-orth-lane-elements kernels/kern_encb.h "check_codecs" \
'            L->x[i] = KERN_SUB(L->x[i], KERN_MUL(L->fd, vj[m + 8 * i]));' \
'            L->x[i] = KERN_SUB(L->x[i], KERN_MUL(L->fd, vj[(m + 1) % 8 + 8 * i]));'

# The same: the emulation folding a step's dots lane by lane as each lane's step comes, so
# the lanes after the first fold partials the lanes before them have already replaced (on the
# device, lanes that run a step ahead of the others' shuffles).
mutation enc-lr-fold-per-lane kernels/kern_encb.h "check_codecs" \
'        } else if (st > 0) {
            kern_enc_lr_fold8(L, offsetof(struct kern_enc_lr_lane, pd),
                              offsetof(struct kern_enc_lr_lane, fd));
        }
        for (uint32_t m = 0; m < 8; m++)
            kern_enc_lr_orth_step(sm, n, c, e, st, m, &L[m]);' \
'        }
        for (uint32_t m = 0; m < 8; m++) {
            if (st > 0)
                kern_enc_lr_fold8(L, offsetof(struct kern_enc_lr_lane, pd),
                                  offsetof(struct kern_enc_lr_lane, fd));
            kern_enc_lr_orth_step(sm, n, c, e, st, m, &L[m]);
        }'

# The same: the keys staged in rows of D floats while the Gram phase reads rows of D + 1.
mutation enc-lr-stage-stride kernels/kern_encb.h "check_codecs" \
'                k[t * (D + 1) + d0 + j] = x[j];' \
'                k[t * D + d0 + j] = x[j];'

# The same: the Gram sums' last partial chunk one channel short (head dims not a multiple
# of 8).
mutation enc-lr-gram-tail kernels/kern_encb.h "check_codecs" \
'            if (c0 + j8 < m)' \
'            if (c0 + j8 + 1 < m)'

# The same: the keys staged again for the factors read in rows of D floats (staged in rows
# of D + 1).
mutation enc-lr-fkeys-stride kernels/kern_encb.h "check_codecs" \
'    return kx ? kx[t * (lay->head_dim + 1) + d] : kern_enc_value(lay, raw, t, h, d);' \
'    return kx ? kx[t * lay->head_dim + d] : kern_enc_value(lay, raw, t, h, d);'

# The same: the keys staged again over the vectors in columns, which the same phase writes
# (on the device a race; here the later threads' keys overwrite the earlier threads' columns).
mutation enc-lr-fstage-at-vectors kernels/kern_encb.h "check_codecs" \
'        kern_enc_lr_keys(a, h, raw, g + 2 * n * n, tid, nt);' \
'        kern_enc_lr_keys(a, h, raw, g + n * n, tid, nt);'

# The same: the start's ranks counting ties the other way (higher index first), so ties of
# the Gram matrix's diagonal start from other columns than the reference's.
mutation enc-lr-start-ties kernels/kern_encb.h "check_codecs" \
'                r += y > x || (y == x && j < i);' \
'                r += y > x || (y == x && j > i);'

# The encode kernel's MERGE plan: after a window of tokens that all join, the next window
# starts one token late (that token joins the run whatever it is).
mutation enc-merge-window-skip kernels/kern_encb.h "check_codecs" \
'    sm->mst[1] = next + n;' \
'    sm->mst[1] = next + n + 1;'

# The same: the scan not stopped when the head's rows are full (runs past ceil(T / 2)).
mutation enc-merge-rows-full kernels/kern_encb.h "check_codecs" \
'    if (next >= T || sm->nrows >= R)' \
'    if (next >= T || sm->nrows >= R + T)'

# The same, by pairs (T <= 64): each token judged against the token before it, not against
# its run's first (the two agree where every token starts a run).
mutation enc-merge-pair-row kernels/kern_encb.h "check_codecs" \
'        const float *x1 = x + t1 * ds, *x2 = x + t2 * ds, *xs = x + s * ds;' \
'        const float *x1 = x + t1 * ds, *x2 = x + t2 * ds, *xs = x + (t1 - 1) * ds;'

# The same: the rows staged in rows of D floats, read in rows of D | 1.
mutation enc-merge-pair-stride kernels/kern_encb.h "check_codecs" \
'                x[t * ds + d0 + j] = v[j];' \
'                x[t * D + d0 + j] = v[j];'

# The same: V's decisions replacing K's instead of and-ed in (a token near its run's first
# in V alone joins it).
mutation enc-merge-pair-v-replaces kernels/kern_encb.h "check_codecs" \
'        near[t1 * T + s] = kind ? (uint8_t)(near[t1 * T + s] & n1) : n1;' \
'        near[t1 * T + s] = n1;'

# The same: the walk marking a new run's start a token late.
mutation enc-merge-walk-late kernels/kern_encb.h "check_codecs" \
'        rows++;
        sm->map[t >> 5] |= 1u << (t & 31);' \
'        rows++;
        sm->map[(t + 1) >> 5] |= 1u << ((t + 1) & 31);'

# The same: a layer's MERGE V section given no units of its own when its K section is not
# MERGE (nothing writes it).
mutation enc-merge-kv-v-alone kernels/kern_encb.h "check_codecs" \
'    return k == 1 && rec->codec[l][0] == KERN_CODEC_MERGE && rec->codec[l][1] == KERN_CODEC_MERGE;' \
'    return k == 1 && rec->codec[l][1] == KERN_CODEC_MERGE;'

# The same: a run's 8 loads in flight one token late (the run's first token left out, the
# next run's first taken in). (Summing them backwards survives: the float sum's rounding
# rarely reaches the fp16 mean.)
mutation enc-merge-rows-load-late kernels/kern_encb.h "check_codecs" \
'                x[j] = kern_enc_value(lay, own, t + j, h, c);' \
'                x[j] = kern_enc_value(lay, own, t + j + 1, h, c);'

# MERGE's AVX-512 encoder (issue 30): a run's threshold taken as |s|^2 without lim (tokens
# far from their run's first join it). Only a CPU with AVX-512 runs that encoder: elsewhere
# these merge512 mutations survive.
mutation merge512-threshold-no-lim kernels/kern_merge512.c "check_codecs" \
'                s->lk = KERN_MUL(lim, nk);' \
'                s->lk = nk;'

# The same: a row of one run written as its halves with -0 kept (the reference's 0 + x is +0).
mutation merge512-one-row-minus-zero kernels/kern_merge512.c "check_codecs" \
'            _mm512_storeu_si512(o + d, _mm512_maskz_mov_epi16(~nz, v));' \
'            _mm512_storeu_si512(o + d, _mm512_maskz_mov_epi16(~nz | nz, v));'

# The same: a K distance that is not finite (the token's K row holds Inf or NaN) not taken
# for the check, so a forced token's bad row is summed unsanitized.
mutation merge512-dist-unchecked kernels/kern_merge512.c "check_codecs" \
'                    nf |= !(dk[i] <= FLT_MAX);' \
'                    nf |= 0;'

# The same: the K pass's key statistics (taken from the rows its distances load) with each
# row's squares summed in another order than kern_avx2_enc.c's statistics pass (the low
# eight channels of both 16-channel halves first): key norms that differ in their last bits.
mutation merge512-stats-norm-order kernels/kern_merge512.c "check_codecs" \
'            const __m512 sq = _mm512_add_ps(_mm512_add_ps(m5_lo2(sa0, sb0), m5_hi2(sa0, sb0)),
                                            _mm512_add_ps(m5_lo2(sa1, sb1), m5_hi2(sa1, sb1)));' \
'            const __m512 sq = _mm512_add_ps(_mm512_add_ps(m5_lo2(sa0, sb0), m5_lo2(sa1, sb1)),
                                            _mm512_add_ps(m5_hi2(sa0, sb0), m5_hi2(sa1, sb1)));'

# The same: the second head of a pair compared with the first head's run (the pair's
# distances from one head's first row).
mutation merge512-pair-second-head kernels/kern_merge512.c "check_codecs" \
'                m5_pair(rk + at + h * D, rk + at + hn * D, st[h].sk, st[hn].sk, h, D, 1, ks,' \
'                m5_pair(rk + at + h * D, rk + at + hn * D, st[h].sk, st[h].sk, h, D, 1, ks,'

# The same: a run's first V row, read where a K row first joins the run, kept from the run
# before (the flag not cleared where a run opens).
mutation merge512-vstart-stale kernels/kern_merge512.c "check_codecs" \
'                s->vset = 0;' \
'                s->vset = s->vset;'

# The same: the V section's rows (which its plan did not read) not checked where written,
# so a NaN or Inf in a V row reaches the section unsanitized.
mutation merge512-v-rows-unchecked kernels/kern_merge512.c "check_codecs" \
'    const int chk = own != c->rawk;' \
'    const int chk = 0;'

# MERGE's AVX2 encoder (clean path): a run's first V row, read where a K row first joins the
# run, kept from the run before (the flag not cleared where a run opens).
mutation merge-avx2-vstart-stale kernels/kern_merge.c "check_codecs" \
'        st->vset = 0;' \
'        st->vset = st->vset;'

# The AVX-512 decoders' streamed stores (issue 30, kern_st512.h): at a 16-byte aligned
# destination a line's third 16 bytes taken from its second (MERGE's rows, KIVI). Outputs
# stream from 1 MiB (KERN_NT_MIN_BYTES): check_kernels' blocks of that size at offset 16
# fail, those just under it pass. Only a CPU with AVX-512 runs these decoders: elsewhere
# this mutation and the three below survive.
mutation st512-stream16-lane kernels/kern_st512.h "check_kernels" \
'        _mm_stream_si128(q + 2, _mm512_extracti32x4_epi32(v, 2));' \
'        _mm_stream_si128(q + 2, _mm512_extracti32x4_epi32(v, 1));'

# The same for two registers of halves (LOWRANK's keys, q8_0 groups): a line's last 16
# bytes taken from the first register's upper half.
mutation st512-halves-stream16-lane kernels/kern_st512.h "check_kernels" \
'        _mm_stream_si128(q + 3, _mm256_extracti128_si256(b, 1));' \
'        _mm_stream_si128(q + 3, _mm256_extracti128_si256(a, 1));'

# MERGE's AVX-512 decode: a token of a damaged map past the rows its head holds (or before
# any run) reads the head's last row instead of row 0, as the reference defines.
mutation merge512-dec-past-rows kernels/kern_merge512.c "check_kernels" \
'            const uint32_t r = n[h] - 1 < R ? n[h] - 1 : 0;' \
'            const uint32_t r = n[h] - 1 < R ? n[h] - 1 : R - 1;'

# LOWRANK's keys and q8_0 values decoded together (kern_lowrank_dec_kv): each slice of value
# groups one step behind, so the last slice is never decoded.
mutation lowrank-kv-slice-behind kernels/kern_lowrank.c "check_kernels" \
'            const uint64_t e = vsect ? ng * ((uint64_t)i * H + h + 1) / steps : 0;' \
'            const uint64_t e = vsect ? ng * ((uint64_t)i * H + h) / steps : 0;'

# LOWRANK's AVX2 / AVX-512 decode (issue 30): a head's eight sigmas loaded straight from the
# section one float late (sigma 1 to 7 and u's first four bytes in their places), so every
# key row of a head of rank 8 or more is wrong. Both CPU paths run it.
mutation lowrank-dec-sigma-direct kernels/kern_lowrank.c "check_codecs check_kernels" \
'        const __m256 sv = m == 8 ? _mm256_loadu_ps((const float *)(head + 16 + 4 * i))' \
'        const __m256 sv = m == 8 ? _mm256_loadu_ps((const float *)(head + 20 + 4 * i))'

# LOWRANK's decode (issue 30): each rank term is one fused multiply-add (KERN_FMA), rounded
# once. Each version taken back to a product and a sum rounded apart: the reference
# (kern_lowrank_val), the AVX-512 tiles (built with -ffp-contract=off: not fused back), the
# AVX2 decode on a CPU without FMA (lr_rows_nofma, which the tests run with the FMA build
# off), the batched decoder's LOWRANK rounds and its generic pieces (the device's code, run by
# the emulation), and KERN_FMA itself on the host. The AVX-512 one is only run by a CPU with
# AVX-512 (elsewhere it survives); the AVX2 FMA build's own tiles are left out: GCC contracts
# a product and a sum there into the same FMA.
mutation lowrank-ref-unfused kernels/kern_ext.h "check_codecs" \
'        acc = KERN_FMA(KERN_MUL(kern_lowrank_sigma(head, i),
                                kern_get_h(u + 2 * ((uint64_t)t * cap + i))),
                       kern_get_h(w + 2 * ((uint64_t)i * dim + d)), acc);' \
'        acc = KERN_ADD(acc, KERN_MUL(KERN_MUL(kern_lowrank_sigma(head, i),
                                kern_get_h(u + 2 * ((uint64_t)t * cap + i))),
                       kern_get_h(w + 2 * ((uint64_t)i * dim + d))));'

mutation lowrank512-dec-unfused kernels/kern_lowrank512.c "check_codecs check_kernels" \
'                    _mm512_fmadd_ps(s, wv[b], acc[a][b]);' \
'                    _mm512_add_ps(acc[a][b], _mm512_mul_ps(s, wv[b]));'

mutation lowrank-nofma-unfused kernels/kern_lowrank.c "check_codecs check_kernels" \
'                acc = KERN_FMA(st[i], wf[(uint64_t)i * D + d], acc);' \
'                acc = KERN_ADD(acc, KERN_MUL(st[i], wf[(uint64_t)i * D + d]));'

mutation lowrank-batch-lane-unfused kernels/kern_batch.h "check_pack" \
'                a[e] = KERN_FMA(f, kern_batch_h2f_if(kern_batch_e16(v, e), nan), a[e]);' \
'                a[e] = KERN_ADD(a[e], KERN_MUL(f, kern_batch_h2f_if(kern_batch_e16(v, e), nan)));'

mutation lowrank-batch-piece-unfused kernels/kern_batch.h "check_codecs check_pack" \
'                    acc[j] = KERN_FMA(f, kern_h2f((uint16_t)kern_batch_e16(v, j)), acc[j]);' \
'                    acc[j] = KERN_ADD(acc[j], KERN_MUL(f, kern_h2f((uint16_t)kern_batch_e16(v, j))));'

mutation kern-fma-host-unfused kernels/kern_fmt.h "check_codecs" \
'#define KERN_FMA(a, b, c) fmaf((a), (b), (c))' \
'#define KERN_FMA(a, b, c) ((a) * (b) + (c))'

# LOWRANK's AVX-512 decode: a head's factor rows w converted sixteen at a time from the wrong
# place (an element's offset taken in bytes, not halves), so each row reads the wrong halves.
mutation lowrank512-wf-offset kernels/kern_lowrank512.c "check_codecs check_kernels" \
'                         _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + 2 * k))));' \
'                         _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + k))));'

# I/O threads: a reply that does not fit in the client's socket is dropped instead of
# closing a client that never reads its replies.
mutation iothreads-slow-consumer-kept daemon/server_io.c "check_e2e_garbage" \
'        if (rc) {
            /* As server_handle' \
'        if (rc && rc != -EAGAIN) {
            /* As server_handle'

# A descriptor a client sends with a request is kept open by the daemon (server_recv, which
# the loop and the I/O threads both read requests with), not closed.
mutation recv-keeps-client-fd daemon/server.c "check_e2e_garbage" \
'                    close(pfd);' \
'                    (void)pfd;'

# I/O threads: a reply's descriptor (NS_OPEN's arena, FAST_ATTACH's index) is not passed.
mutation iothreads-reply-no-fd daemon/server_io.c "check_e2e_iothreads" \
'        rc = ioc->mute ? 0 : server_sendmsg(ioc->fd, r->data, m->len, m->fd);' \
'        rc = ioc->mute ? 0 : server_sendmsg(ioc->fd, r->data, m->len, -1);'

# A datagram of no bytes read as a hang-up before its descriptors are looked at: the
# descriptors it carried stay open in the daemon (a client could fill its table).
mutation recv-empty-keeps-fd daemon/server.c "check_e2e_adversary" \
'    if (msg.msg_controllen) {
        /* Clients send no descriptors' \
'    if (n && msg.msg_controllen) {
        /* Clients send no descriptors'

# I/O threads: once a read saw the hang-up, the replies queued for the connection are
# dropped (a client that shut down its side loses the answers to what it sent before).
mutation iothreads-hangup-drops-replies daemon/server_io.c "check_e2e_adversary" \
'        rc = ioc->mute ? 0 : server_sendmsg' \
'        rc = ioc->mute || ioc->dead ? 0 : server_sendmsg'

# I/O threads' fallback: a socket handed back to the loop thread is watched edge-triggered,
# so the requests already waiting in it past the loop's first read of eight are never read
# (a pipelining client stalls across the hand-over).
mutation iofallback-loop-edge daemon/server_io.c "check_e2e_iothreads" \
'        if (loop_add(sv->loop, ioc->fd, EPOLLIN, server_on_conn, c) == 0) {' \
'        if (loop_add(sv->loop, ioc->fd, EPOLLIN | EPOLLET, server_on_conn, c) == 0) {'

# The same, the other way: a socket handed to an I/O thread stays watched by the loop thread
# too, so both read it.
mutation iofallback-loop-keeps-socket daemon/server_io.c "check_e2e_iothreads" \
'        loop_del(sv->loop, c->fd);
        sv->store->total.io_to_threads++;' \
'        sv->store->total.io_to_threads++;'

# A quiet RELEASE answered all the same: the client reads a reply it did not wait for where
# the next request's should be.
mutation release-quiet-answered daemon/server_dispatch.c "check_e2e_put" \
'                  (r.hdr->flags & KVC_MSG_F_QUIET));' \
'                  false);'

# The key map's slot tags ignored: every entry a probe walks past is read again.
mutation index-tags-ignored daemon/index.c "check_index" \
'        if ((v & tmask) == tag) {' \
'        if ((v & tmask) == tag || v) {'

# The quiet flag taken on every request: a LOOKUP sent quiet pins without answering.
mutation quiet-flag-any-request daemon/proto.c "check_proto check_e2e_put" \
'    if ((h->flags & KVC_MSG_F_QUIET) && h->opcode != KVC_OP_RELEASE) {' \
'    if (false) {'

# kvc_release waits for the daemon again (the round trip the quiet RELEASE saves).
mutation libkvc-release-waits client/libkvc_lease.c "check_e2e_put" \
'    quiet = quiet && (c->features & KVC_HELLO_F_QUIET);' \
'    quiet = false;'

# MERGE's shortcut past the reference plan (issue 30): kern_merge_may_force never says "may
# force", so the quantize worker would keep blocks whose tokens were forced into a run.
mutation merge-may-force-never kernels/kern.c "check_codecs" \
'                if (rows == R)' \
'                if (rows == R + 1)'

# The same, reading the K sections only: a layer merging its values alone is never asked.
mutation merge-may-force-k-only kernels/kern.c "check_codecs" \
'            if (er.codec[l][k] != KERN_CODEC_MERGE)' \
'            if (er.codec[l][k] != KERN_CODEC_MERGE || k == 1)'

# MERGE's AVX2 encode of a V section planned alone (its keys another codec) judging the V
# row against the run's K row, as it once did: rows fields and bytes not the reference's.
mutation merge-v-alone-v-row kernels/kern_merge.c "check_codecs" \
'            join = mrg_within_h(xk_r, st->sk, st->nk, D, lim);' \
'            join = mrg_within_h(xr, st->sk, st->nk, D, lim);'

# The quantize worker's merge step taking kern_merge_may_force's 1 for a count of forced
# tokens: a block whose heads hold all their rows, none forced, refused.
mutation quant-merge-may-force-refuses daemon/quant.c "check_quant" \
'            f = kern_merge_forced(lay, &j->rec, src);' \
'            f = f > 0 ? 1 : f;'

# The same, trusting the encode without the plan: a block with forced tokens kept as merge.
mutation quant-merge-plan-skipped daemon/quant.c "check_quant" \
'            f = kern_merge_forced(lay, &j->rec, src);' \
'            f = 0;'

# The worker's re-encode one rung down decoding the lossy block where it lies in the arena,
# as it once did: a writer of the arena rewriting its section table between the decoder's
# check and its use sends the decoder past the arena (test_requantize_raced).
mutation quant-requant-decodes-arena daemon/quant.c "check_quant" \
'                    ? kern_decode_cpu(lay, priv, j->raw.len, raw, rb, (enum kern_dtype)lay->dtype)' \
'                    ? kern_decode_cpu(lay, j->src, j->raw.len, raw, rb, (enum kern_dtype)lay->dtype)'

# The disk tier compressing (and, when the block stays raw, hashing and writing) the block
# where it lies, as it once did: a writer of the host arena changing it meanwhile gets its
# bytes into the record, or a record that fails its checksum (test_encode_under_writer).
mutation disk-encode-from-arena tiers/disk_rec.c "check_tier_disk" \
'        in = op->data_bounce;' \
'        in = op->src;'

# The worker encoding straight into the block's new arena slot, as it once did: the encoder
# reads its section table back from there, so a writer of the arena that rewrites it sends
# the encoder's writes past the slot (test_encode_into_arena_raced).
mutation quant-encodes-into-arena daemon/quant.c "check_quant" \
'    if (!j->later && !j->group) {' \
'    if (0) {'

# kern_merge_may_force trusting the section table it reads again after kern_block_info's
# check: a writer of the arena slot the worker encoded into sends its rows read 4 GiB on
# (test_merge_may_force_raced).
mutation merge-may-force-table-reread kernels/kern.c "check_codecs" \
'            if (s.offset > len || len - s.offset < (uint64_t)lay->heads * hb)' \
'            if (0)'

# kvcsim's ghost hits not counted (kvcsim --counts, set beside the daemon's ghost_hits): the
# simulator still restores the counts, only the figure goes (check_sim test_counts).
mutation sim-ghost-hits-uncounted tests/lib/sim.c "check_sim" \
'                    s->r->ghost_hits++;' \
'                    (void)0;'

# Issue 30: kvcsim's clients meeting a put in progress skip the rest of their request again,
# where the daemon holds their RESERVE until the writer commits and then goes on.
mutation sim-busy-skips-chain tests/lib/sim.c "check_sim" \
'                parent = x;
                continue;' \
'                parent = UINT32_MAX;
                continue;'

# The lru trigger never steps a slab down whole when an encoded slot finds no room: the
# arena's pages stay cut for raw blocks and it evicts instead of quantizing.
mutation quant-no-room-no-slab daemon/quant.c "check_e2e_quant" \
'                    int m = no_room ? no_room(s, i) : 0;' \
'                    int m = ((void)no_room, 0);'

# A merge step refused with no rung after it does not mark its block: one with children goes
# back to the ladder and is taken to merge again and again while the arena stays full.
mutation merge-refused-not-marked daemon/quant.c "check_e2e_replay" \
'        s->ix.blocks[j->idx].merge_refused = 1;' \
'        (void)s->ix.blocks[j->idx].merge_refused;'

# Merge stays on a ladder that it refuses nearly every block of: each block of the rung above
# it is stepped on to merge and leaves, so that rung never holds one.
mutation merge-never-off daemon/quant.c "check_e2e_replay" \
'    ns->merge_off = true;' \
'    ns->merge_off = false;'

# The quantize worker's bound counted every arena's jobs together: a tenant whose own arena's
# ladder steps kept the worker at host.quantize_inflight made another tenant's ladder step
# wait for room that no job of its arena was bringing, and its put was answered NOSPACE.
mutation quant-inflight-all-arenas daemon/engine.c "check_e2e_adversary_pool" \
'    if (quant_inflight_in(s->quant, s->ix.blocks[v].arena) >= s->p.quantize_inflight)' \
'    if (quant_inflight(s->quant) >= s->p.quantize_inflight)'

# A put that waits for write-back no longer records what it waits for, so its arena gets no
# turns: write-back takes the disk's write queue and write budget arena by arena again, and
# a tenant putting into arena 0 as fast as the disk writes keeps every write while another
# tenant's puts into its private arena, full of blocks only in memory, wait out
# disk.put_wait and are answered NOSPACE.
mutation disk-put-need-unrecorded daemon/engine_disk.c "check_e2e_adversary_pool" \
'    if (bytes - ed->writing[arena] > ed->need[arena])' \
'    if (false && bytes - ed->writing[arena] > ed->need[arena])'

# BLOCK_LIST walks the whole index again, not SERVER_BLOCK_LIST_WALK entries: one tenant's
# listings of an empty namespace stall every other tenant's requests.
mutation block-list-walk-unbounded daemon/server_dispatch.c "check_e2e_adversary" \
'    if (end > ix->nblocks || end < q->cursor)' \
'    if (end > ix->nblocks || end >= q->cursor)'

# ---- machinery ------------------------------------------------------------------------------

key() { echo "$1" | tr -- '-.' '__'; }
get() { eval "echo \"\$m_$1_$(key "$2")\""; }

run_make() {
    nice -n 10 make -C "$work" -j2 CUDA=0 --no-print-directory "$@" >>"$log" 2>&1
}

# Runs the suites (names); 0 when all pass. The failing one's name goes to $failed.
run_suites() {
    failed=""
    for s in $1; do
        (cd "$work" && CK_DEFAULT_TIMEOUT=$((120 * slow)) timeout $((600 * slow)) \
            "build/tests/$s") >>"$log" 2>&1 || failed="$failed $s"
    done
    [ -z "$failed" ]
}

targets() {
    t="build/bin/kvcd build/bin/kvcctl"
    for s in $1; do t="$t build/tests/$s"; done
    case " $1 " in
    *" check_e2e_replay "*) t="$t build/bin/kvcreplay build/bin/kvcsim" ;; # the client it runs
    esac
    echo "$t"
}

wanted() {
    [ -z "$only" ] && return 0
    for o in $only; do [ "$o" = "$1" ] && return 0; done
    return 1
}

usage() {
    echo "usage: tests/mutation/run.sh [NAME...]   (make mutation)"
    echo "Applies each mutation (or the NAMEs), runs its suites, prints mutation -> result;"
    echo "exits 0 only when every mutation was killed, 1 otherwise, 2 on a usage error."
    echo "mutations:"
    for m in $m_names; do echo "  $m ($(get suites "$m"))"; done
}

# The known name nearest to $1 (edit distance).
nearest() {
    echo "$m_names" | tr ' ' '\n' | awk -v w="$1" '
        function lev(a, b,    i, j, la, lb, c, d, x, y, z) {
            la = length(a); lb = length(b)
            for (j = 0; j <= lb; j++) d[0, j] = j
            for (i = 1; i <= la; i++) {
                d[i, 0] = i
                for (j = 1; j <= lb; j++) {
                    c = substr(a, i, 1) != substr(b, j, 1)
                    x = d[i - 1, j] + 1; y = d[i, j - 1] + 1; z = d[i - 1, j - 1] + c
                    d[i, j] = x < y ? (x < z ? x : z) : (y < z ? y : z)
                }
            }
            return d[la, lb]
        }
        NF { v = lev(w, $0); if (best == "" || v < bestv) { best = $0; bestv = v } }
        END { print best }'
}

# Every argument is checked before anything is copied or built.
for o in $only; do
    case "$o" in
    -h | --help)
        usage
        exit 0
        ;;
    -*)
        echo "run.sh: unknown option '$o'" >&2
        usage >&2
        exit 2
        ;;
    esac
    case " $m_names " in
    *" $o "*) ;;
    *)
        echo "run.sh: unknown mutation '$o' (the nearest is '$(nearest "$o")'; --help lists" \
            "them)" >&2
        exit 2
        ;;
    esac
done

echo "mutation: copying the tree to $work"
(cd "$src" && git ls-files -co --exclude-standard | tar -cf - -T -) | tar -xf - -C "$work" ||
    exit 1
all_suites=""
for m in $m_names; do
    wanted "$m" || continue
    for s in $(get suites "$m"); do
        case " $all_suites " in *" $s "*) ;; *) all_suites="$all_suites $s" ;; esac
    done
done
echo "mutation: building (CUDA=0) and running the suites on the unmutated tree:$all_suites"
if ! run_make $(targets "$all_suites"); then
    tail -n 40 "$log"
    echo "mutation: the unmutated tree does not build"
    exit 1
fi
if ! run_suites "$all_suites"; then
    tail -n 60 "$log"
    echo "mutation: the unmutated tree fails$failed: the table would mean nothing"
    exit 1
fi

printf '%-32s %-52s %s\n' "mutation" "suites" "result"
status=0
for m in $m_names; do
    wanted "$m" || continue
    file=$(get file "$m")
    suites=$(get suites "$m")
    start=$(date +%s)
    cp "$work/$file" "$work/$file.orig"
    if ! OLD=$(get old "$m") NEW=$(get new "$m") perl -0777 -i -pe '
            BEGIN { $o = $ENV{OLD}; $n = $ENV{NEW}; $c = 0 }
            $c = () = /\Q$o\E/g; s/\Q$o\E/$n/ if $c == 1;
            END { exit($c == 1 ? 0 : 3) }' "$work/$file"; then
        result="not applied (text not found once in $file)"
        status=1
    elif ! run_make $(targets "$suites"); then
        result="no build"
        status=1
    elif run_suites "$suites"; then
        result="SURVIVED"
        status=1
    else
        result="killed by$failed"
    fi
    mv "$work/$file.orig" "$work/$file"
    touch "$work/$file"
    printf '%-32s %-52s %s (%ss)\n' "$m" "$suites" "$result" $(($(date +%s) - start))
done
# leave the copy as it was built: rebuild nothing, it is removed
exit $status
