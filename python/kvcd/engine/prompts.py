# DESIGN: prompts for the reference engine's demo, tests and benchmark. The tokenizer is the
# UTF-8 bytes (token id = byte value; the model's vocabulary has at least 256 ids), enough
# to build prompts that share system prompts and few-shot headers the way real traffic does.
SYSTEMS = [
    "You are a careful assistant for a hardware store. Answer briefly, cite the aisle, "
    "and never invent stock levels. ",
    "You are a support agent for a cloud provider. Be precise about regions, quotas and "
    "billing; ask for the account id when it matters. ",
]
FEWSHOT = [
    "Q: Where are the hinges? A: Aisle 4, next to the door handles.\n"
    "Q: Do you cut keys? A: Yes, at the service desk by the entrance.\n",
    "Q: How do I raise a quota? A: Open a ticket with the region and the new limit.\n"
    "Q: Why was I billed twice? A: Usually a retried payment; it is refunded in 3 days.\n",
]
QUESTIONS = [
    "Q: Which screws fit oak decking? A:",
    "Q: Can I move a volume between regions? A:",
    "Q: Is there a discount for contractors? A:",
    "Q: What happens when a node loses power? A:",
    "Q: Do you rent floor sanders? A:",
    "Q: How long do snapshots stay? A:",
]


def encode(text):
    return list(text.encode("utf-8"))


def decode(tokens):
    return bytes(t for t in tokens if t < 256).decode("utf-8", "replace")


def system_prompt(i, tokens):
    """System prompt i, repeated with a running section number to `tokens` tokens."""
    out, n = [], 0
    while len(out) < tokens:
        out += encode("[%d] %s" % (n, SYSTEMS[i % len(SYSTEMS)]))
        n += 1
    return out[:tokens]


def chat_prompt(system, fewshot, question, system_tokens):
    """A prompt: a shared system prompt, a shared few-shot header, a question of its own."""
    return (system_prompt(system, system_tokens) + encode(FEWSHOT[fewshot % len(FEWSHOT)]) +
            encode(QUESTIONS[question % len(QUESTIONS)]))
