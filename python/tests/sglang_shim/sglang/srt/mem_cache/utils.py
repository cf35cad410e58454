# The page hash chain of SGLang's HiCache (one SHA-256 per page over the previous page's
# hash and the page's token ids, as hex strings). A stand-in for tests (see
# sglang/__init__.py).
import hashlib


def get_hash_str(token_ids, prior_hash=None, page_size=1):
    out, h = [], prior_hash
    for i in range(0, len(token_ids) - len(token_ids) % page_size, page_size):
        hasher = hashlib.sha256()
        if h:
            hasher.update(bytes.fromhex(h))
        for t in token_ids[i:i + page_size]:
            hasher.update(int(t).to_bytes(4, "little"))
        h = hasher.hexdigest()
        out.append(h)
    return out
