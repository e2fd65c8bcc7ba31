"""The classifier's rules as data: one :class:`Rule` per row (id, family, pattern, source).

Pure data, no I/O (docs/policy.md §2). The tables, in the order the decision consults them
(:mod:`fsm.core.classify.decide`):

- :data:`OVERFLOW_RULES`: context overflow, handed to compaction and never retried;
- :data:`PERMANENT_RULES`: permanent conditions that only look transient (**D1**);
- :data:`STATUS_RULES`: HTTP statuses named in the text (the innermost decides);
- :data:`USAGE_LIMIT_RULES` and :data:`RETRYABLE_RULES`: the retryable families (**D2**, **D3**);
- :data:`INWORD_RULES`: retryable words inside longer words (class names);
- :data:`ERROR_CODES`: typed error codes and types of the structured path.

Patterns match the *normal form* of the message (:func:`fsm.core.hints.normalize_text`): lower
case, whitespace runs collapsed to one space, ``\\n`` escapes of doubly encoded JSON as
spaces, curly quotes straightened, URLs removed. So write patterns in lower case, with single
spaces, without capturing groups (use ``(?:…)``), and start every alternative with a literal
character (the scanner skips positions by their first two characters; the tests check it).
Every pattern must run in linear time: no nested unbounded quantifiers, and bounded gaps
(``.{0,40}``) between parts. Rules match at word starts only (after a character that is not a
letter, a digit or ``_``), except rules marked ``anywhere`` and alternatives written in scripts
without spaces (Chinese, Japanese), which are looked for anywhere when no word-start rule of
their step matched.

To add a provider's phrasing: add a row to the right table (a new family if needed, listed in
:data:`fsm.core.classify.FAMILIES`) with its public source, add the message to a
``tests/data/provider-errors*.jsonl`` corpus file or to the unit tests of that family, and run
``pytest tests/core/test_classify.py``. A rule must describe a family of messages, not copy one;
docs/classification.md lists the families.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "ERROR_CODES",
    "FAMILIES",
    "FATAL_STATUSES",
    "INWORD_RULES",
    "OVERFLOW_RULES",
    "PERMANENT_RULES",
    "RETRYABLE_RULES",
    "RETRYABLE_STATUSES",
    "Rule",
    "STATUS_RULES",
    "USAGE_LIMIT_RULES",
    "YIELDS_TO_HINT",
    "family_of_rule",
    "family_of_status",
]

FAMILIES: tuple[str, ...] = (
    "overloaded", "rate_limit", "usage_limit", "server_error", "network", "stalled", "timeout",
    "retry_later", "overflow", "billing", "auth", "invalid_request", "not_found", "content_policy",
    "region", "configuration", "resources", "model_output", "unknown", "other", "none",
)
"""The closed set of failure families (:attr:`fsm.core.classify.Classification.family`, the
``family`` of every :class:`Rule`; docs/classification.md "Families" says what each covers).
Retryable: ``overloaded`` (the provider is at capacity: 529, ``overloaded_error``,
"overloaded"), ``rate_limit``, ``usage_limit`` (a plan's or quota's window), ``server_error``
(5xx, a gateway that could not relay), ``network`` (the connection failed or dropped),
``stalled`` (the stream went silent), ``timeout`` (a request or attempt timed out),
``retry_later`` (the provider only says to retry). Overflow: ``overflow``. Fatal:
``billing``, ``auth``, ``invalid_request``, ``not_found``, ``content_policy``, ``region``,
``configuration`` (TLS trust, a host name that was never set), ``resources`` (a local runtime
cannot hold the model), ``unknown`` (text with no status, no typed code and no rule: the rule
``fatal.unmatched``; one retry under ``retry.unknown: "once"``), ``other`` (a status or typed
code that names nothing more specific). Retryable too: ``model_output`` (the provider's own model
failed to produce valid output: ``tool_use_failed``, "failed to generate valid JSON"; docs/policy.md
§2). ``none``: the turn did not fail."""


@dataclass(frozen=True, slots=True)
class Rule:
    """One row of a pattern table.

    ``id``: stable, dotted, prefixed by the outcome (``overflow.``, ``fatal.``, ``retryable.``),
    e.g. ``"retryable.overloaded"``; reported as :attr:`Classification.rule`. ``family``: the
    group of conditions it belongs to, one of :data:`FAMILIES` (``"overloaded"``,
    ``"rate_limit"``, ``"server_error"``, ``"network"``, ``"overflow"``, ``"billing"``…). ``pattern``: regex source text,
    matched against the normal form of the message (see the module docstring). ``source``:
    where the rule comes from (a provider's documentation, a public bug, a policy item such as
    D1/D2/D3, corpus row ids).
    """

    id: str
    family: str
    pattern: str
    source: str
    anywhere: bool = False
    """``True``: looked for anywhere in the text, also inside longer words ("APIRateLimitError")
    and in scripts written without spaces; such a rule is consulted only when no word-start
    rule of its step matched."""




# --------------------------------------------------------------------------------------------
# Pattern helpers

# D3: a status code is a standalone number. Not preceded by a letter, digit, `_`, `.`, `,`, `/`,
# `-`, `+`, `$`, `#` (ids, decimals, 500,000, URL paths, amounts); not followed by a word
# character, `%`, a decimal or thousands part, `-digit`, or a unit ("1500 tokens" is no 500,
# and neither is "500 tokens").
_NOT_BEFORE = r"(?<![a-z0-9_.,/+$#-]\d\d\d)"
_NOT_AFTER = (r"(?![a-z0-9_%]|[.,]\d|-\d"
              r"| ?(?:tokens?|bytes?|[kmg]b\b|chars?|characters?|words?|requests?|messages?"
              r"|ms\b|s\b|secs?\b|seconds?|minutes?|mins?\b|hours?|days?|per\b))")


def _status(numbers: str) -> str:
    """A standalone 3-digit status number; ``numbers`` starts with a literal digit."""
    return f"{numbers}{_NOT_BEFORE}{_NOT_AFTER}"


# 4xx statuses that are never worth retrying as such (408 timeout, 409, 413 size, 425, 429
# and 499 are left out on purpose).
_CLIENT_4XX = r"4(?:0[013-7]|1[0-2]|1[4-8]|2[1-46-8]|31|51)(?![0-9])"

# A gateway's label used as a prefix ("relay error (channel #3): …", "Upstream error from X: …",
# "Upstream request failed: …"): followed by a colon and more text, it decides nothing; the text
# after it does (docs/policy.md §2). With nothing after the colon the label is all there is.
_NOT_A_PREFIX = r"(?! ?(?:\([^()]{0,40}\) ?)?: ?[^ ])(?! from [a-z0-9 ._()-]{1,40}: ?[^ ])"

# --------------------------------------------------------------------------------------------
# Step 3: context overflow (handed to compaction, never retried)

OVERFLOW_RULES: tuple[Rule, ...] = (
    Rule("overflow.prompt_too_long", "overflow",
         r"prompt (?:\([0-9,]{1,12} tokens?\) )?(?:is )?too long",
         "Anthropic 'prompt is too long: N tokens > M maximum'; Fireworks; pi-mono overflow.ts; "
         "corpus anthropic-400-prompt-too-long-json"),
    Rule("overflow.input_too_long", "overflow",
         r"input (?:prompt )?(?:\([0-9,]{1,12} tokens?\) )?(?:is )?too long",
         "Amazon Bedrock 'Input is too long for requested model' (ValidationException); "
         "corpus bedrock-*-input-too-long"),
    Rule("overflow.exceeds_context", "overflow",
         r"exceed(?:s|ed|ing)? (?:(?:the|this|your|its|a|model's|model|available|maximum|max|allowed"
         r"|configured) ){0,3}"
         r"context(?: |_|-)?(?:window|length|size|limit)",
         "OpenAI Responses 'Your input exceeds the context window of this model'; Anthropic "
         "'input length and max_tokens exceed context limit' and 413 'Request size exceeds model "
         "context window'; llama.cpp 'exceeds the available context size'; Ollama 'input length "
         "exceeds the context length'; docs/policy.md §2"),
    Rule("overflow.context_window_exceeds", "overflow",
         r"context (?:window|length|size) (?:exceeds?|exceeded|overflow)",
         "MiniMax 'context window exceeds limit'; pi-mono overflow.ts"),
    Rule("overflow.max_context_length", "overflow",
         r"maximum context length (?:is |of )?\d|too large for model with \d",
         "OpenAI/Azure/DeepSeek/vLLM/OpenRouter \"This model's maximum context length is N "
         "tokens\"; Mistral 'too large for model with N maximum context length'; docs/policy.md §2"),
    Rule("overflow.token_count_exceeds", "overflow",
         r"token count (?:of )?(?:\(?[0-9,]{1,12}\)? )?exceeds? (?:the )?(?:max|limit)",
         "Gemini/Vertex 'The input token count (N) exceeds the maximum number of tokens allowed'; "
         "GitHub Copilot 'prompt token count of N exceeds the limit of M'; docs/policy.md §2"),
    Rule("overflow.input_tokens_exceed", "overflow",
         r"(?:input|prompt) tokens? (?:count )?exceed(?:s|ed)? (?:the )?(?:configured |maximum "
         r"|max )?(?:limit|context)",
         "OpenAI Codex 'Input tokens exceed the configured limit of N tokens'"),
    Rule("overflow.length_exceeds", "overflow",
         r"(?:input|prompt) length (?:exceeds?|exceeded) (?:the )?(?:max|limit|context)"
         r"|exceeds? (?:the )?max(?:imum)? (?:allowed )?(?:input|prompt|sequence) length",
         "AI21/Cohere/Ollama 'prompt length exceeds maximum', 'exceeds the maximum input length'"),
    Rule("overflow.longer_than_context", "overflow",
         r"(?:greater|larger|longer) than (?:the )?(?:max(?:imum)? )?(?:context (?:length|size"
         r"|window)|model'?s? context length|maximum model length)",
         "LM Studio 'greater than the context length'; llama.cpp 'larger than the max context "
         "size'; vLLM 'is longer than the maximum model length'; docs/policy.md §2"),
    Rule("overflow.context_length_exceeded", "overflow",
         r"context[_ ]length[_ ]exceeded|model_context_window_exceeded|context_window_exceeded"
         r"|exceed_context_size_error"
         r"|model_max_prompt_tokens_exceeded|max_prompt_tokens_exceeded|prompt_too_long",
         "OpenAI code context_length_exceeded; llama.cpp type exceed_context_size_error; "
         "Copilot code model_max_prompt_tokens_exceeded; docs/policy.md §2; pi-mono overflow.ts"),
    Rule("overflow.lm_studio", "overflow",
         r"keep the first [0-9,]{1,12} tokens when context(?: the)? overflows|context length of only \d"
         r"|reached context length of \d|mid-generation context overflow"
         r"|load the model with a larger context length|context length of only \d",
         "LM Studio 'Trying to keep the first N tokens when context the overflows', 'loaded with "
         "context length of only N tokens', 'Reached context length of N tokens'"),
    Rule("overflow.reduce_length", "overflow",
         r"reduce the length of the (?:messages|prompt|input)",
         "Groq/OpenAI 'Please reduce the length of the messages'; pi-mono overflow.ts"),
    Rule("overflow.maximum_prompt_length", "overflow",
         r"maximum prompt length is \d",
         "xAI \"This model's maximum prompt length is N but the request contains M tokens\""),
    Rule("overflow.token_limit", "overflow",
         r"exceed(?:s|ed)? (?:the )?(?:model'?s? |model )?(?:max(?:imum)? )?token limit"
         r"|token limit exceeded(?! per)|(?:input|prompt) token limit",
         "Kimi 'exceeded model token limit'; VS Code LM API 'Message exceeds token limit'; "
         "docs/policy.md §2 'token limit exceeded'"),
    Rule("overflow.too_many_tokens", "overflow",
         r"too many (?:input |prompt )?tokens(?![,.:]? (?:please wait|per |processed|in the last))",
         "docs/policy.md §2 'too many tokens' (Cohere 'too many tokens: total number of tokens in the "
         "prompt cannot exceed'); not Bedrock/Cerebras throttling ('Too many tokens, please "
         "wait', 'per day', 'processed'; corpus bedrock-*, cerebras-tpm-too-many-tokens)"),
    Rule("overflow.tgi_inputs", "overflow",
         r"`inputs` (?:must have less than [0-9,]{1,12} tokens|tokens \+ `max_new_tokens` must be <=)",
         "Hugging Face TGI / Together 'Input validation error: `inputs` must have less than N "
         "tokens'; corpus tgi-*"),
    Rule("overflow.qwen_input_length_range", "overflow",
         r"range of input length should be",
         "Alibaba DashScope (Qwen) 'Range of input length should be [1, N]'"),
    Rule("overflow.request_above_limit", "overflow",
         r"request too large for|must be reduced in order to run successfully"
         r"|(?:request|input|prompt) (?:is |was )?(?:larger|bigger|greater) than (?:the |your |this )?"
         r"(?:per[ -]minute |rate |token |tpm )*limit",
         "docs/policy.md §2: one request larger than a per-minute token limit can never succeed "
         "as it is, even inside a 429 (OpenAI/Groq 'Request too large for <model> … on tokens per "
         "min (TPM): Limit N, Requested M … must be reduced in order to run successfully')"),
    Rule("overflow.request_too_large", "overflow",
         r"request_too_large|request (?:body |payload )?too large|payload too large"
         r"|max(?:imum)? request body size (?:of )?[0-9,]{1,15} (?:bytes )?exceeded"
         r"|request (?:size )?exceeds the maximum (?:allowed )?size|payload size exceeds the limit"
         r"|string_above_max_length",
         "Anthropic 413 request_too_large (32 MB); Groq 413 'Request too large for model'; "
         "GitHub Models 'Request body too large'; Gemini 'Request payload size exceeds the "
         "limit'. Byte limits, but shrinking the history is the only fix (corpus notes)"),
    Rule("overflow.bedrock_body_length", "overflow",
         r"'body' failed to satisfy constraint: member must have length",
         "Bedrock InvokeModel 25 MB body limit; corpus bedrock-validation-body-25000000"),
    Rule("overflow.max_input_length", "overflow",
         r"(?:longer|larger|greater) than (?:the |this |its )?(?:model'?s? )?max(?:imum)? "
         r"(?:allowed )?(?:input|prompt|sequence|model) length"
         r"|max(?:imum)? (?:allowed )?(?:input|prompt) length (?:is |of )?\d",
         "an input longer than the model's maximum input length (vLLM/TGI/embedding servers "
         "'is longer than the maximum input length', 'maximum input length of N tokens')"),
    Rule("overflow.cannot_truncate", "overflow",
         r"(?:cannot|can't|could not|couldn't|unable to|failed to) (?:be )?truncat(?:e|ed)"
         r"|truncation (?:failed|is not possible|impossible)",
         "a prompt that cannot be truncated to fit the context (local runtimes that refuse to "
         "drop the system prompt or the last message): shrinking the history is the fix"),
    Rule("overflow.length_validation", "overflow",
         r"(?:input|prompt) (?:\([^()]{0,40}\) )?(?:length |tokens? )?(?:\([^()]{0,40}\) )?(?:is |are )?"
         r"(?:exceeds?|exceeded|exceeding) (?:the |its )?max(?:imum)? (?:allowed |permitted |supported )?"
         r"(?:length|size|tokens|context)"
         r"|too long to fit into the model|too long to fit in (?:the |its )?context"
         r"|must be (?:less|smaller|lower|fewer) than (?:or equal to )?(?:the )?max_(?:seq|sequence|model|input"
         r"|num_tokens|position)(?:_len(?:gth)?|_embeddings)?"
         r"|(?:message|messages|context|conversation|input|prompt|request) length (?:\([^()]{0,40}\) )?"
         r"(?:exceeds?|exceeded|over) (?:the )?(?:limit|max)"
         r"|maxlength(?: of| is|:|=)? ?\d|string too long\. expected a string with maximum length"
         r"|(?:longer|larger|greater) than (?:the )?(?:api'?s? )?maximum string length",
         "an input longer than the model's or the API's limit, in the words of local servers and "
         "relays: SGLang 'Input length (N tokens) exceeds the maximum allowed length (M tokens)' "
         "(https://github.com/sgl-project/sglang/issues/4048); vLLM 'The prompt (total length N) "
         "is too long to fit into the model (context length M)' "
         "(https://github.com/vllm-project/vllm/issues/12165); TensorRT-LLM 'must be less than "
         "max_seq_len'; relays' 'message length exceeds limit'; JSON-schema 'maxLength' "
         "validation; OpenAI 'string too long. Expected a string with maximum length N'"),
    Rule("overflow.context_size_exceeded", "overflow",
         r"context (?:size|length|window) (?:has been |was |is )?(?:exceeded|overflowed|exhausted)"
         r"|(?:exceeded|exceeds|exceeding|out of) (?:the )?kv[ -]?cache (?:size|slots?|space)"
         r"|(?:longer|larger|greater) than (?:the )?model\\?'s context length",
         "a local server's 'context size exceeded' / 'context size has been exceeded' (llama.cpp "
         "server, LM Studio; even inside an HTTP 500: an overflow marker outranks the status, "
         "docs/policy.md §8b.8); SGLang 'longer than the model\\'s context length' with the quote "
         "escaped in JSON (https://github.com/QwenLM/Qwen3/issues/1321)"),
    Rule("overflow.context_wording", "overflow",
         r"(?:ran|run|running|runs) out of (?:room|space) in (?:the |its |your )?(?:model'?s? )?context"
         r"|no (?:room|space) left in (?:the |its |your )?(?:model'?s? )?context|context window (?:is )?full"
         r"|(?:input|prompt|sequence) length (?:of )?\(?[0-9,]{1,12}\)? (?:tokens )?exceeds? (?:the )?max(?:imum)?"
         r" (?:allowed |supported |input |prompt )?(?:length|tokens)"
         r"|(?:input|prompt) tokens (?:\(?[0-9,]{1,12}\)? )?(?:has |have )?exceed(?:ed|s)? (?:the )?"
         r"max_?(?:prompt|input)_?tokens",
         "context overflow in the words of agents and servers the older rules did not know, as a family: "
         "the model's context window 'ran out of room' (an agent's own report), 'Input length N exceeds the "
         "maximum length M' (embedding and inference servers), 'number of input tokens (N) has exceeded "
         "max_prompt_tokens (M)' (a proxy's per-model prompt cap); shrinking the history is the fix "
         "(docs/policy.md §2)"),
    Rule("overflow.status_no_body", "overflow",
         r"^4(?:00|13) ?(?:status code)? ?\(no body\)",
         "Cerebras/Mistral bare '400 status code (no body)' / '413 (no body)' at the start of "
         "the message; docs/policy.md §2; pi-mono overflow.ts"),
)

# --------------------------------------------------------------------------------------------
# Step 4: permanent conditions that only look transient (D1)

PERMANENT_RULES: tuple[Rule, ...] = (
    # billing: nothing changes until someone pays
    Rule("fatal.insufficient_quota", "billing",
         r"insufficient[_ ]quota",
         "OpenAI 429 insufficient_quota; D1; corpus openai-insufficient-quota-*"),
    Rule("fatal.exceeded_current_quota", "billing",
         r"exceeded your current quota",
         "OpenAI/Gemini 'You exceeded your current quota, please check your plan and billing "
         "details'; D1. Stands down when the message also carries a retry hint (Gemini "
         "sends this wording with 'Please retry in Ns' for per-minute quotas)"),
    Rule("fatal.credit_balance", "billing",
         r"credit balance (?:is )?too low|insufficient (?:account )?(?:credits?|balance|funds)"
         r"|(?:purchase|buy|requires?) more credits|can only afford|used all (?:available |your )?credits"
         r"|out of credits|no credits (?:left|remaining)|exceeded (?:your |the )?(?:monthly |included |free "
         r"|daily )*credits"
         r"|credits? (?:have been |has been |are "
         r"|is )?(?:exhausted|depleted)"
         r"|arrearage|in arrears|overdue (?:payment|balance|bill)|balance (?:is )?(?:insufficient"
         r"|not enough|exhausted|depleted|negative)|recharge|not in good standing",
         "Anthropic 'Your credit balance is too low'; DeepSeek 402 'Insufficient Balance'; "
         "OpenRouter 402 'requires more credits … can only afford'; xAI 'used all available "
         "credits'; DashScope code Arrearage / 'make sure your account is in good standing'; "
         "D1"),
    Rule("fatal.cn_billing", "billing",
         r"余额不足|欠费|已停机|额度(?:不足|已用完|已用尽|已耗尽|用完)|请充值|充值后",
         "billing exhaustion as Zhipu ('余额不足或无可用资源包,请充值'), Moonshot, DashScope and "
         "DeepSeek write it in Chinese: balance insufficient, in arrears, quota used up, please "
         "recharge; docs/policy.md §2", anywhere=True),
    Rule("fatal.spending_limit", "billing",
         r"spending (?:limit|cap)|billing[_ ]hard[_ ]limit|billing_not_active|account is not active"
         r"|premium request allowance|you have no (?:remaining )?quota|trial (?:has )?(?:expired|ended)"
         r"|(?:monthly|daily|weekly|account|organi[sz]ation|workspace) (?:spend(?:ing)?|budget|cost) (?:limit|cap)"
         r"|budget (?:has been |was )?(?:exceeded|reached|exhausted)|reached the set (?:inference |usage )?limit"
         r"|service has been paused|safe experience mode",
         "spend caps stay billing (docs/policy.md §2): monthly and other budgets set on the account, "
         "Volcengine Ark's 'reached the set inference limit … the model service has been paused' (Safe "
         "Experience Mode, https://github.com/volcengine/MineContext/issues/328); "
         "xAI 'reached its monthly spending limit' (corpus xai-*); OpenAI "
         "billing_hard_limit_reached / billing_not_active; Copilot 'exceeded your premium "
         "request allowance', 402 'You have no quota'"),
    Rule("fatal.entitlement", "billing",
         r"(?:extra usage|usage credits?|additional credits|a paid plan|a paid account|a subscription) (?:is|are) required"
         r"|requires? (?:a |an )?(?:paid|pro|higher|upgraded|premium|team|enterprise|business) (?:plan|tier|subscription|account)"
         r"|not (?:enabled|available|included|supported) (?:for|on|in|with) (?:your|this|the current) (?:plan|tier"
         r"|subscription|account type)|out of extra usage|(?:enable|turn on) extra usage",
         "docs/policy.md §2 (SPEC §15.11): a 429 or 403 whose text states an entitlement or plan "
         "requirement (Anthropic 429 'Extra usage is required for long context requests', 'Usage credits "
         "are required', 'not enabled for your plan') can never succeed until the plan changes: fatal, "
         "even typed rate_limit_error (https://github.com/anthropics/claude-code/issues/42616)"),
    Rule("fatal.trial_allowance", "billing",
         r"(?:reached|exhausted|used up|hit|exceeded|used all) (?:of )?(?:your |the )?(?:free )?trial"
         r"(?: (?:request|message|usage|api))? (?:limit|quota|allowance|credits?|requests)"
         r"|trial(?: (?:request|message|usage|api))? (?:limit|quota|allowance|credits?) (?:has been |is |was )?"
         r"(?:reached|exceeded|exhausted|used up|depleted)",
         "docs/policy.md §2: a trial or free request allowance used up is not a rate limit: no window "
         "refills it, only an upgrade (a trial request limit of an editor's hosted models)"),
    Rule("fatal.should_not_retry", "invalid_request",
         r"x-should-retry: ?false",
         "the server's own verdict in the x-should-retry response header (OpenAI and Anthropic "
         "APIs), as fsm.providers.sdk_errors appends it to an error text"),
    Rule("fatal.payment_required", "billing",
         _status("402") + r"|payment[_ ]required",
         "HTTP 402 Payment Required (DeepSeek, OpenRouter, Copilot); D1"),
    Rule("fatal.quota_limit_zero", "billing",
         r"limit(?:[:=]| of| is)? ?0(?![0-9a-z]|[.,][0-9])"
         r"|quota_?value\\?[\"']?:? ?\\?[\"']?0(?![0-9.])",
         "D1 'quotas whose limit is 0': Gemini 'Quota exceeded for metric: …, limit: 0'; "
         "OpenAI 'Limit 0, Used 0, Requested N' (a model the tier does not include); Google "
         "QuotaFailure quotaValue '0'. A real limit ('limit: 1000000') stays a transient quota"),
    Rule("fatal.quota_value_zero", "billing",
         r"quota_limit_value\\?[\"']?:? ?\\?[\"']?0(?![0-9.])|0/0 (?:used|requests?|tokens?|credits?)|0 of 0 (?:used|requests?|tokens?|credits?)"
         r"|(?:doesn't|does not) have a free (?:quota )?tier"
         r"|limit_value\\?[\"']?:? ?\\?[\"']?0(?![0-9.])",
         "D1 'quotas whose limit is 0' in the other spellings of a zero limit: Google "
         "QuotaFailure metadata quota_limit_value '0' (a model the free tier does not include), "
         "a plan page's '0 of 0 used'. A real limit ('quota_limit_value': '250') stays transient"),
    Rule("fatal.host_undefined", "configuration",
         r"enotfound (?:[a-z0-9._:-]{0,80}?undefined|null(?![a-z0-9.-]))"
         r"|eai_again (?:[a-z0-9._:-]{0,80}?undefined|null(?![a-z0-9.-]))"
         r"|(?:could not resolve host|no such host|unknown host|lookup):? (?:[a-z0-9._:-]{0,80}?undefined"
         r"|null(?![a-z0-9.-]))",
         "a DNS failure for a host name that contains 'undefined' (or is 'null'): a base URL or "
         "an environment variable that was never set, as JavaScript turns it into text "
         "('getaddrinfo ENOTFOUND undefined'); the same request fails until the configuration "
         "is fixed, unlike an outage"),
    Rule("fatal.model_load_failed", "resources",
         r"(?:failed|unable) to load (?:the )?model|(?:could not|couldn't|cannot|can't) load (?:the )?model"
         r"|error loading model|try a different model",
         "a local runtime that cannot load the model (LM Studio 'Failed to load the model … Try a "
         "different model and/or config', llama.cpp 'error loading model'): not the transient "
         "'Loading model' of a server still starting"),
    Rule("fatal.request_entity_too_large", "invalid_request",
         r"request entity too large(?![^.]{0,80}(?:context|token))",
         "docs/policy.md §2: the HTTP 413 reason phrase as a proxy's page (nginx client_max_body_size) is "
         "a request-size refusal: fatal, not a context overflow; a provider's own size error "
         "(request_too_large, 'Maximum request body size N exceeded') is still overflow "
         "(https://github.com/langgenius/dify/issues/20869)"),
    Rule("fatal.out_of_memory", "resources",
         r"(?:cannot|can't|could not|couldn't|unable to|failed to) allocate(?: [a-z_]{1,20}){0,3} "
         r"(?:memory|buffer)|out of memory|(?:requires|needs) more (?:system |gpu |video )?memory"
         r"|(?:insufficient|not enough) (?:system |gpu |video |available )?memory"
         r"|(?:projected|required|estimated) memory|memory [^.;]{0,60}would exceed",
         "a local runtime that cannot allocate memory for the model (Ollama 'model requires "
         "more system memory', llama.cpp 'failed to allocate buffer', CUDA 'out of memory'): "
         "the same request fails the same way until the setup changes"),
    # authentication and authorisation
    Rule("fatal.invalid_api_key", "auth",
         r"(?:invalid|incorrect|missing|no|wrong|expired|revoked) (?:x-)?api[ _-]?key"
         r"|invalid_api_key|api[ _-]?key (?:is )?(?:not valid|invalid|expired|revoked|missing"
         r"|required|not found)"
         r"|api_key_invalid",
         "OpenAI 401 'Incorrect API key provided' / invalid_api_key; Anthropic 'invalid "
         "x-api-key'; Gemini 400 'API key not valid' API_KEY_INVALID; corpus "
         "gemini-api-key-invalid-nuxt-500-prefix, openai-401-server-error-prefix"),
    Rule("fatal.authentication", "auth",
         r"authentication[_ ]?(?:error|failed|failure)|invalid[_ ](?:authentication|auth\b|bearer"
         r"|access token|token)"
         r"|unauthori[sz]ed|unauthenticated|permission_error"
         r"|access (?:is )?denied"
         r"|request_forbidden|no cookie auth credentials"
         r"|(?:account|organization|organisation) (?:has been |is |was )?(?:deactivated|disabled"
         r"|suspended|banned)"
         r"|(?:oauth|access|auth|authentication|api|bearer|session) token (?:has |is )?(?:expired|revoked|invalid)",
         "Anthropic authentication_error / permission_error; OpenAI 403 request_forbidden; "
         "Vertex PERMISSION_DENIED; OpenRouter 401 'No cookie auth credentials found'"),
    Rule("fatal.permission_denied", "auth",
         r"permission[_ -]?denied",
         "Vertex PERMISSION_DENIED, Connect/gRPC 'Permission denied:'; stands down when the message "
         "also states when to come back ('Permission denied: Reached message rate limit … Resets in: "
         "30m0s', https://github.com/dwgx/WindsurfAPI/issues/11): a refusal with a reset is not permanent"),
    Rule("fatal.region_unsupported", "region",
         r"unsupported_country|country, region,? or territory not supported|user location is not supported"
         r"|not available in your (?:country|region)|unsupported[_ ]region"
         r"|(?:doesn't|does not|don't|do not) serve your (?:region|country)",
         "OpenAI 403 unsupported_country_region_territory; Gemini 400 FAILED_PRECONDITION 'User "
         "location is not supported'"),
    Rule("fatal.tls_certificate", "configuration",
         r"certificate[_ ]verify[_ ]failed|self[- _]signed[_ ]cert"
         r"|unable to (?:get|verify) (?:the )?(?:local )?(?:issuer |first )?certificate"
         r"|unable_to_verify_leaf_signature|unable_to_get_issuer_cert|cert_has_expired"
         r"|certificate has expired"
         r"|err_tls_cert_altname_invalid|does not match certificate's altnames|hostname mismatch",
         "Python ssl CERTIFICATE_VERIFY_FAILED, Node SELF_SIGNED_CERT_IN_CHAIN / "
         "UNABLE_TO_VERIFY_LEAF_SIGNATURE: a TLS-intercepting proxy or a missing CA bundle "
         "fails the same way until the configuration changes; corpus ssl-cert-verify-*, "
         "litellm-internalservererror-cert-verify"),
    Rule("fatal.content_policy", "content_policy",
         r"content management policy|content_policy_violation|responsibleaipolicyviolation"
         r"|rejected as a result of (?:our|the) safety system|flagged as potentially violating"
         r"|invalid_prompt"
         r"|code[\"']: ?[\"']content_filter",
         "Azure content_filter / 'content management policy' (its 'Please modify your prompt "
         "and retry' is not a retry); OpenAI content_policy_violation, invalid_prompt"),
    Rule("fatal.model_not_found", "not_found",
         r"model_not_found|not_found_error|does not exist or you do not have access"
         r"|model [\"'`][^\"'`]{1,100}[\"'`] (?:not found|does not exist|is not supported)"
         r"|try pulling it first|model (?:has been )?decommissioned|model_decommissioned|unknown model"
         r"|requested model [^.]{0,100}? is not available (?:on|in|for|via) (?!your )",
         "OpenAI/Groq 404 model_not_found; Anthropic not_found_error; Ollama 'model \"x\" not "
         "found, try pulling it first'"),
)

# Retryable words that real messages also carry inside longer words (class names such as
# "ProviderRateLimitError", "ModelOverloadedException", "UpstreamTimeoutError"): looked for
# anywhere, and only when no word-start rule matched.
INWORD_RULES: tuple[Rule, ...] = (
    Rule("retryable.inword_rate_limit", "rate_limit",
         r"ratelimit|rate_limit|toomanyrequests|throttl",
         "router and SDK exception class names with the word inside ('OpenRouterRatelimitError', "
         "'APIRateLimitError', 'UpstreamTooManyRequests')", anywhere=True),
    Rule("retryable.inword_overloaded", "overloaded",
         r"overloaded|serviceunavailable|unavailableerror",
         "class names such as 'ModelOverloadedException', 'UpstreamServiceUnavailable'",
         anywhere=True),
    Rule("retryable.inword_quota_window", "usage_limit",
         r"perday|perhour",
         "quota ids with the window inside a longer word (Gemini "
         "'GenerateRequestsPerDayPerProjectPerModel-FreeTier'): a usage limit; the usage-limit "
         "flag looks for them in the whole text", anywhere=True),
    Rule("retryable.inword_timeout", "timeout",
         r"timeout(?:error|exception)|timedout",
         "class names such as 'APITimeoutError', 'UpstreamTimeoutException'", anywhere=True),
)

# --------------------------------------------------------------------------------------------
# Status markers: HTTP statuses in the text. Within the text, the innermost (last) one decides
# over the families of step 5 (a 400 wrapping an upstream 429 is a 429; a 502 wrapping a 404
# is a 404); permanent conditions (step 4) and overflow (step 3) still come first.

STATUS_RULES: tuple[Rule, ...] = (
    Rule("fatal.client_status", "invalid_request",
         r"(?:status(?:[ _]?code)?|http(?:/[0-9.]{1,3})?|error(?:[ _]?code)?|code)"
         r"[:= \"'\\(\[]{0,4}" + _CLIENT_4XX,
         "an explicit 4xx status (400-407, 410-418 but 413, 421-428 but 425, 431, 451) is not "
         "transient even inside a 'Server Error:' or 'InternalServerError' wrapper; corpus "
         "openai-401-server-error-prefix, hermes-openrouter-401-attempt-1-of-3"),
    Rule("fatal.client_status_phrase", "invalid_request",
         r"400 bad request|401 unauthorized|403 forbidden|404 not found|405 method not allowed"
         r"|406 not acceptable|410 gone|415 unsupported media type|422 unprocessable (?:entity|content)",
         "HTTP reason phrases of permanent 4xx statuses (RFC 9110 §15.5)"),
    Rule("fatal.client_status_leading", "invalid_request",
         r"^" + _CLIENT_4XX,
         "a message that starts with a permanent 4xx status (Node SDK '404 The model …', "
         "'401 Incorrect API key provided')"),
    Rule("fatal.not_found", "not_found",
         r"not[ _]found(?<!host not found)(?<!host not_found)",
         "a bare 'Not Found' (the reason phrase of 404) inside a gateway's 502 or a wrapper: the "
         "innermost verdict is a missing route or model; not DNS 'host not found'"),
    Rule("fatal.route_not_found", "not_found",
         r"cannot (?:post|get|put|patch|delete) /|no route (?:matched|found) (?:with|for)"
         r"|(?:route|endpoint|path) (?:\S{1,80} )?(?:not found|does not exist)",
         "a gateway's 502 or 404 whose body is the upstream's 'Cannot POST /v1/…' page (Express) "
         "or a router's 'no Route matched' (Kong): the route does not exist, and retrying the "
         "same URL cannot help (a base URL with a wrong path)"),
    Rule("retryable.gateway_no_response", "server_error",
         r"failed to get (?:a )?response from (?:the )?(?:upstream|provider|backend|model|origin)"
         r"|(?:no|empty) response from (?:the )?(?:upstream|provider|backend|origin)",
         "a gateway that got no answer from the provider: Cloudflare AI Gateway code 2005 'Failed "
         "to get response from provider', sent inside an HTTP 400 "
         "(https://github.com/cloudflare/ai/issues/436): like a status, the innermost decides, so "
         "the wrapper's 400 does not make it fatal"),
    Rule("retryable.status_529", "overloaded",
         _status("529"),
         "Anthropic 529 Overloaded; D2"),
    Rule("retryable.status_429", "rate_limit",
         _status("429"),
         "HTTP 429 Too Many Requests (RFC 6585); base families (docs/policy.md §2); D3"),
    Rule("retryable.status_503", "server_error",
         _status("503"),
         "HTTP 503 Service Unavailable (RFC 9110 §15.6.4): a capacity signal "
         "(docs/classification.md \"Capacity signal\"); D3 standalone numbers"),
    Rule("retryable.status_5xx", "server_error",
         _status("5(?:0[024]|2[0-4])"),
         "the base 500/502/504 and Cloudflare 520-524; D3 standalone numbers"),
    Rule("retryable.status_408", "timeout",
         _status("408"),
         "HTTP 408 Request Timeout"),
    Rule("retryable.typed_transient", "server_error",
         r"serviceunavailableexception|internalserverexception|modelnotreadyexception"
         r"|modeltimeoutexception|modelstreamerrorexception|throttlingexception"
         r"|overloaded_error|rate_limit_error|rate_limit_exceeded",
         "a provider's typed verdict named in the text (Bedrock ':exception-type' "
         "serviceUnavailableException/ThrottlingException, Anthropic overloaded_error/"
         "rate_limit_error, OpenAI rate_limit_exceeded): like a status, the innermost decides, "
         "so a 400 event-stream frame whose exception type is transient is retried"),
    Rule("retryable.should_retry", "server_error",
         r"x-should-retry: ?true|is_?retryable\\?[\"']?: ?true",
         "the server's own verdict in the x-should-retry response header (OpenAI and Anthropic "
         "APIs), as fsm.providers.sdk_errors appends it to an error text"),
)

# Rules that stand down when the message also carries a retry hint (or names a quota window)
# and no other permanent rule matches. (A 402 or insufficient_quota stands down only for a usage
# window with a stated reset: decide.py, USAGE_WINDOW_ONLY.)
YIELDS_TO_HINT: frozenset[str] = frozenset({"fatal.exceeded_current_quota", "fatal.permission_denied"})

# --------------------------------------------------------------------------------------------
# Step 5: retryable families

USAGE_LIMIT_RULES: tuple[Rule, ...] = (
    Rule("retryable.usage_limit", "usage_limit",
         r"usage[ _-]?limit(?<!not your usage limit)(?<!not a usage limit)(?<!not the usage limit)"
         r"|limit_reached",
         "the base 'usage limit' family and docs/policy.md §2 'Usage limits' (\"usage limit\", "
         "usage_limit_reached, limit_reached): Claude and Codex subscription windows"),
    Rule("retryable.usage_window_limit", "usage_limit",
         r"h(?<=[0-9][ -]h)(?:ou)?r limit (?:reached|hit|exceeded)|(?:weekly|daily|session|opus"
         r"|sonnet) limit (?:reached|hit)",
         "Claude Code '5-hour limit reached ∙ resets 3pm', 'Weekly limit reached'; corpus "
         "claude-5-hour-limit-reached-bare"),
    Rule("retryable.usage_hit_your_limit", "usage_limit",
         r"(?:you'?ve|you have) (?:hit|reached|exceeded) (?:your |the )?(?:[a-z0-9-]{1,20} ){0,3}"
         r"limit",
         "Claude Code / Codex \"You've hit your limit · resets 3pm (Europe/Berlin)\", \"You've "
         "hit your usage limit\": a subscription window; the hint comes from the reset time"),
    Rule("retryable.free_quota_window", "usage_limit",
         r"(?:free|daily|weekly|monthly|hourly|plan) (?:tier )?(?:quota|usage|allowance|request quota"
         r"|message limit|messages) (?:has been |have been |is |was |are )?(?:used up|used|exhausted"
         r"|exceeded|reached|depleted|consumed)"
         r"|come back (?:in|at|after|on|tomorrow)"
         r"|(?:you'?re|you are) out of (?:[a-z0-9-]{1,20} ){0,2}(?:messages|requests|prompts)",
         "a free or periodic quota used up until a stated reset (a relay's 402 'free quota used "
         "… resets at <time> UTC', a chat app's 'come back in 3h47m'): a usage window with a "
         "hint, not billing exhaustion; a 402 or billing wording next to it stands down when the "
         "reset time is given (https://github.com/Gitlawb/openclaude/issues/1554); Codex 'You're "
         "out of Codex messages … resets on <date>' (https://github.com/openai/codex/issues/26197)"),
    Rule("retryable.quota_window", "usage_limit",
         r"(?:requests?|tokens?|calls?) per (?:day|hour)\b|per[ _-](?:day|hour)\b|free-models-per-day"
         r"|rp[dh](?![a-z0-9_])|tp[dh](?![a-z0-9_])|daily[ _-]?(?:quota|limit|request limit"
         r"|token limit)|(?:hourly|daily) (?:usage|rate) limit",
         "docs/policy.md §2: quota windows are usage limits (OpenAI 'requests per day (RPD)', "
         "Groq 'tokens per day (TPD)', OpenRouter 'free-models-per-day', Gemini "
         "'GenerateRequestsPerDayPerProjectPerModel')"),
)

RETRYABLE_RULES: tuple[Rule, ...] = (
    # overloaded: the provider is at capacity
    Rule("retryable.overloaded", "overloaded",
         r"overloaded|serveroverloaded|server_is_overloaded",
         "base families (docs/policy.md §2); Anthropic 529 overloaded_error; OpenAI 'The server is currently overloaded'; "
         "Gemini 503 'The model is overloaded'"),
    Rule("retryable.capacity", "overloaded",
         r"(?:no|insufficient|out of|over|at|lack of) capacity|capacity (?:exceeded|exhausted"
         r"|unavailable|constraints?|limits? reached)"
         r"|model_capacity_exhausted|capacity_exhausted|capacity_exceeded|experiencing high demand"
         r"|exhausted (?:your |the |its |all )?(?:available )?capacity"
         r"|high demand|server (?:is )?(?:too )?busy"
         r"|too busy|maximum pending requests|(?:model|engine) is (?:currently )?(?:loading"
         r"|warming up|not ready)"
         r"|is currently loading|loading model|model_not_ready|modelnotready"
         r"|high traffic|heavy (?:load|traffic)|under (?:high|heavy) load|temporarily overloaded"
         r"|(?:model|service|server|system|engine|cluster|gpus?)s? (?:is |are )?(?:currently |temporarily )?"
         r"(?:busy|saturated|at capacity)",
         "Google MODEL_CAPACITY_EXHAUSTED 'No capacity available'; Mistral 'Service tier "
         "capacity exceeded'; Gemini 'high demand'; Ollama 'server busy … maximum pending "
         "requests'; Hugging Face 503 'Model … is currently loading'; Bedrock "
         "ModelNotReadyException; llama.cpp 503 'Loading model'"),
    # the provider's own model failed to produce valid output (docs/policy.md §2, SPEC §15.11)
    Rule("retryable.model_output", "model_output",
         r"tool[_ ]use[_ ]failed|json_validate_failed|failed_generation|failed to call a function"
         r"|failed to generate (?:a )?(?:valid )?(?:json|tool calls?|function calls?|structured output|output)"
         r"|(?:did not|didn't|failed to) (?:provide|produce|generate) (?:any |a |an )?(?:assistant messages?"
         r"|valid output|usable output|output)"
         r"|tried to use \S{1,60} without (?:a )?value for (?:the )?required parameter"
         r"|(?:model|llm) (?:returned|produced|generated) (?:an? )?(?:invalid|malformed|empty) (?:json|output"
         r"|response|tool calls?)"
         r"|ended the response before returning usable output",
         "docs/policy.md §2 (SPEC §15.11): a provider's failure to produce valid output of its own model "
         "is retryable, at most maxRetries: Groq 400 tool_use_failed 'Failed to call a function. Please "
         "adjust your prompt. See failed_generation' (https://github.com/anomalyco/opencode/issues/1018), "
         "'Failed to generate JSON' (json_validate_failed), an agent's 'the language model did not provide "
         "any assistant messages' or a tool call without a required argument; it outranks a 4xx status"),
    # rate limits
    Rule("retryable.concurrency", "rate_limit",
         r"concurren(?:cy|t requests?) (?:limit|quota)|(?:high|too much|excessive) concurrency"
         r"|(?:reduce|lower|decrease) (?:your |the )?concurrency|max(?:imum)? (?:organi[sz]ation |account |user )?"
         r"concurrency|too many concurrent|concurrency (?:exceeded|too high)",
         "concurrency limits in their wordings: Zhipu 1302 'High concurrency usage of this API, please "
         "reduce concurrency' (https://github.com/anomalyco/opencode/issues/9559), relays' 'Concurrency "
         "limit exceeded for user, please retry later', Moonshot 'request reached max organization "
         "concurrency: 1'"),
    Rule("retryable.request_rate", "rate_limit",
         r"rate (?:increased|increasing|grew|rose|rising) too (?:quickly|fast)"
         r"|(?:sent|sending requests) too (?:quickly|fast|frequently)",
         "a burst above a provider's smoothing limit: Alibaba Model Studio 'Request rate increased too "
         "quickly … scale requests more smoothly' (https://github.com/paperclipai/paperclip/issues/2885)"),
    Rule("retryable.rate_limit", "rate_limit",
         r"rate[ _-]?limit|ratelimit|speed[ _-]?limit|slow[ _]down|reduce your rate of requests",
         "base families (docs/policy.md §2); OpenAI/Anthropic rate_limit_error, Azure 'Rate limit is exceeded', "
         "Copilot 'speed limited' (corpus copilot-speed-limited-2-minutes)"),
    Rule("retryable.throttled", "rate_limit",
         r"throttl",
         "Bedrock ThrottlingException, 'Request was throttled'; Azure throttling_error"),
    Rule("retryable.too_many_requests", "rate_limit",
         r"too many (?:concurrent )?requests|too_many_requests|toomanyrequests",
         "the base family 'too many requests'"),
    Rule("retryable.too_many_tokens", "rate_limit",
         r"too many tokens|concurren(?:cy|t requests?) limit",
         "Bedrock 'Too many tokens, please wait before trying again' (a 429 "
         "ThrottlingException, not overflow: corpus bedrock-cc-429-too-many-tokens)"),
    Rule("retryable.per_time_quota", "rate_limit",
         r"(?:requests?|tokens?) per (?:second|sec|minute|min)\b|quota exceeded"
         r"|exceeded (?:the )?quota"
         r"|resource[ _](?:has been )?exhausted|resourceexhausted",
         "Gemini/Vertex 429 RESOURCE_EXHAUSTED 'Quota exceeded for quota metric … per minute'; "
         "Cerebras 'Tokens per minute limit exceeded'; Bedrock 'Too many tokens per day'"),
    Rule("retryable.cn_rate_limit", "rate_limit",
         r"请求过于频繁|请求太频繁|速率限制|频率限制|限流|服务繁忙|负载已?饱和|稍后再试|稍后重试"
         r"|并发数?(?:过高|过大|超过|超出|超限|已达上限)|降低并发|请求速度过快|访问频率|访问过于频繁|频率超限"
         r"|請求過於頻繁|並發數?過高",
         "Chinese gateways (one-api/new-api, Copilot zh-CN): 'requests too frequent', 'rate "
         "limit', 'busy', 'load saturated', 'try again later'"),
    # HTTP-like server classes and their names
    Rule("retryable.gateway_relay", "server_error",
         r"(?:could not|couldn't|unable to|failed to|cannot|can't) (?:relay|forward|proxy|reach|contact)"
         r" (?:the |your |this )?(?:request |message |call )?(?:to )?(?:the )?(?:upstream|backend"
         r"|origin|provider|model server)"
         r"|error (?:while )?(?:relaying|forwarding|proxying)|(?:relay|forward|proxy)(?:ing)? "
         r"(?:error|failed|failure)" + _NOT_A_PREFIX +
         r"|upstream (?:request |call |connection )?(?:error|failure|failed|unavailable|returned an? "
         r"error|service unavailable|provider (?:error|failed))" + _NOT_A_PREFIX +
         r"|error from (?:the )?upstream" + _NOT_A_PREFIX +
         r"|provider returned error|failed to get (?:a )?response from",
         "a gateway or router that could not relay the request upstream (LiteLLM/one-api/new-api "
         "'failed to forward request', OpenRouter 'Provider returned error', envoy/nginx "
         "'upstream error'); a permanent condition or a 4xx inside still decides. Written as a prefix "
         "('relay error (channel #3):', 'Upstream error from Alibaba:', 'upstream_error') the gateway's "
         "label decides nothing: the text after it does (docs/policy.md §2, SPEC §15.11)"),
    Rule("retryable.service_unavailable", "server_error",
         r"service[ _]?(?:is )?(?:temporarily )?unavailable|temporarily unavailable"
         r"|temporarily unable to process|(?:is|are) (?:currently )?unable to (?:process|handle|serve)"
         r" (?:your|the|this) request"
         r"|status\\?[\"']?:? ?\\?[\"']?unavailable\b|statuscode\.unavailable|no healthy upstream"
         r"|(?:under|undergoing) (?:scheduled |planned )?maintenance|maintenance mode|be back shortly",
         "base families (docs/policy.md §2); the reason phrase of 503; Bedrock "
         "ServiceUnavailableException; Google status UNAVAILABLE; gRPC StatusCode.UNAVAILABLE; "
         "envoy 503 'no healthy upstream'; a maintenance page: a capacity signal "
         "(docs/classification.md \"Capacity signal\")"),
    Rule("retryable.bad_gateway", "server_error",
         r"bad ?gateway|gateway ?time-?out|origin (?:is )?unreachable",
         "nginx/Cloudflare 502/504 pages named without their number: a gateway that could not "
         "get an answer, not a capacity signal (docs/classification.md \"Capacity signal\")"),
    Rule("retryable.server_error", "server_error",
         r"server[ _]?error|internal[ _]?(?:server[ _]?)?(?:error|exception)|server had an error"
         r"|status\\?[\"']?:? ?\\?[\"']?internal\b",
         "the base family 'server error' / 'internal error'; D3 server_error / internal_error "
         "(underscore); OpenAI 'The server had an error while processing your request'; "
         "Google status INTERNAL; Bedrock InternalServerException"),
    # network transients (D2)
    Rule("retryable.connection", "network",
         r"connection[ _-]?(?:error|reset|refused|closed|aborted|timed? ?out|lost|dropped|terminated"
         r"|failed|failure|broken|interrupted)"
         r"|connection (?:was |has been )?(?:closed|reset|dropped|aborted|terminated|lost|refused)"
         r"|connect ?error|connect call failed|apiconnectionerror|clientconnectorerror"
         r"|network[ _-]?error|network (?:is )?(?:unreachable|down|unavailable)|err_network"
         r"|network request failed"
         r"|err_connection_|transport ?error|transporterror",
         "the base family 'connection error'; D2 connection reset/refused/closed; OpenAI and "
         "Anthropic SDK APIConnectionError 'Connection error.'; httpx ConnectError; asyncio "
         "'Connect call failed'; aiohttp ClientConnectorError; Elixir Mint/Req 'transport error: "
         "closed' (Mint.TransportError, a dropped connection)"),
    Rule("retryable.errno", "network",
         r"e(?:connreset|connrefused|connaborted|timedout|pipe|hostunreach|netunreach|netdown"
         r"|notfound|ai_again)\b"
         r"|winerror 100(?:53|54|60|61)|errno (?:104|110|111|113|32|54|60|61)\]",
         "POSIX/Windows socket errors (ECONNRESET, ECONNREFUSED, ETIMEDOUT, EPIPE, EAI_AGAIN, "
         "WinError 10054/10060/10061, [Errno 104/111])"),
    Rule("retryable.cannot_connect", "network",
         r"(?:unable|cannot|can't|could not|couldn't|failed) to connect|cannot connect"
         r"|no connection could be made"
         r"|failed to establish a new connection|no such host|name or service not known"
         r"|temporary failure in name resolution|getaddrinfo|(?:could not|couldn't|can't|unable to) connect"
         r"|trouble connecting|(?:issue|problem) connecting to"
         r"|(?:do|send|sending) request failed|error sending request|failed to send (?:the )?request",
         "urllib3 'Failed to establish a new connection'; aiohttp 'Cannot connect to host'; "
         "Windows 'No connection could be made'; Claude Code 'Unable to connect to API'; DNS"),
    Rule("retryable.fetch_failed", "network",
         r"fetch failed|failed to fetch|und_err_(?:socket|connect_timeout|headers_timeout"
         r"|body_timeout|closed|destroyed)",
         "the base family 'fetch failed' (Node undici); browsers 'Failed to fetch'; undici codes"),
    Rule("retryable.socket_closed", "network",
         r"socket hang up|other side closed|socket (?:connection )?(?:was )?(?:closed|disconnected"
         r"|error|timeout)"
         r"|socketerror|broken pipe|server ?disconnected|remote end closed connection|remotedisconnected"
         r"|peer closed connection|closed by (?:the )?(?:remote|peer)|forcibly closed|reset by peer"
         r"|reset before headers|upstream connect error|upstream (?:request )?timeout"
         r"|upstream prematurely closed"
         r"|goaway|stream (?:was )?(?:reset|disconnected|interrupted)|stream closed before"
         r"|stream ended unexpectedly"
         r"|err_http2_stream_error|http2 stream error|readerror|writeerror",
         "D2: socket hang up, other side closed, upstream connect error (envoy, corpus "
         "envoy-upstream-reset-reason-overflow); aiohttp ServerDisconnectedError; HTTP/2 GOAWAY; "
         "Codex 'stream disconnected before completion'; httpx ReadError"),
    Rule("retryable.premature_close", "network",
         r"premature(?:ly)?[ _](?:close|closed|end)|err_stream_premature_close|ended prematurely"
         r"|incomplete ?(?:chunked )?read|incompleteread"
         r"|incomplete ?message|connection broken|response payload is not completed"
         r"|unexpected[ _]eof|ssleoferror"
         r"|eof occurred in violation of protocol|unexpected end of (?:stream|file|data)"
         r"|remote ?protocol ?error",
         "D2 premature close (node-fetch ERR_STREAM_PREMATURE_CLOSE); httpx "
         "RemoteProtocolError 'incomplete chunked read'; requests ChunkedEncodingError; "
         "aiohttp ClientPayloadError; ssl UNEXPECTED_EOF_WHILE_READING"),
    Rule("retryable.terminated", "network",
         r"terminated(?<!been terminated)(?<!was terminated)(?<!is terminated)(?<!process has terminated)",
         "D2 'terminated' (undici 'TypeError: terminated' when the body stream dies); "
         "not 'account has been terminated'"),
    Rule("retryable.websocket", "network",
         r"web ?socket(?:[ _-]?(?:error|exception|closed?|disconnect(?:ed)?|fail(?:ed|ure)|timeout"
         r"|timed out|protocol error|connection (?:closed|failed|lost|error|reset)|is (?:not open"
         r"|closed))|(?: connection)?(?: to .{0,120}?)? (?:failed|closed|error|was closed|lost)"
         r"|(?: [a-z]{1,20})? (?:communication|connection) (?:error|failed|closed|lost))"
         r"|no close frame|abnormal closure",
         "docs/policy.md §2: WebSocket errors are transport failures (browsers 'WebSocket "
         "connection to … failed', websockets ConnectionClosedError, Codex/Realtime 'WebSocket "
         "closed', ws 'WebSocket is not open')"),
    Rule("retryable.no_response", "network",
         r"ended without (?:a |an )?(?:finish|response|message_stop|\[done\]|stop)"
         r"|did not get a response|no response (?:was )?(?:received|from (?:the )?(?:server|upstream))"
         r"|empty reply from server|stream ended before|(?:did not|didn't) return (?:a |any )?response"
         r"|not responding",
         "a stream or request that ended without an answer: HTTP/2 'request did not get a "
         "response', curl 'Empty reply from server', 'stream ended before message_stop'"),
    Rule("retryable.stream_stalled", "stalled",
         r"stream (?:has )?stalled|stalled (?:stream|response)|stream (?:went|was|is) (?:silent|idle)"
         r"|no (?:data|tokens?|chunks?|bytes) (?:received )?(?:for|in) (?:the last )?\d",
         "docs/policy.md §13.1: the stall watchdog's own texts 'stream stalled: no response "
         "within 30 s' / 'stream stalled: no data for 60 s'; a stream that went silent"),
    Rule("retryable.attempt_timeout", "timeout",
         r"attempt (?:has )?timed out after|attempt timeout",
         "the attempt timeout's own words (docs/policy.md §13.2): 'attempt timed out after 120 s'"),
    Rule("retryable.timeout", "timeout",
         r"timed?[ _-]?out|deadline[ _]?exceeded|(?:read|connect|write|pool|headers|body|api|model)timeout",
         "D2 'timed out'; undici HeadersTimeoutError; httpx ReadTimeout; litellm Timeout "
         "/ APITimeoutError; gRPC/Google 504 DEADLINE_EXCEEDED; Bedrock ModelTimeoutException"),
    Rule("retryable.stream_finish_error", "network",
         r"finish_reason\\?[\"']?:? ?\\?[\"']?error\b",
         "OpenRouter and other routers end a stream with finish_reason 'error' when the upstream "
         "provider fails mid-generation; our provider reports it as 'The provider ended the "
         "stream with finish_reason: error'"),
    # the provider says when (or that) to retry
    Rule("retryable.try_request_again", "retry_later",
         r"(?:please try|try) (?:your|the|this) request again(?! with| using)"
         r"|(?:please retry|retry) (?:your|the|this) request(?! with| using)"
         r"|you (?:can|may|should) retry(?! with| using)|try again (?:shortly|soon|momentarily"
         r"|in a (?:few|moment|little|bit))",
         "docs/policy.md §2: provider text that asks to try the request again (OpenAI 'You can "
         "retry your request', Anthropic/Gemini 'An unexpected error occurred. Please try your "
         "request again', 'try again shortly')"),
    Rule("retryable.request_failed_retry", "retry_later",
         r"(?:request|call) (?:has )?failed[,.;:]? (?:please )?(?:retry|try again)",
         "docs/policy.md §13.6: text saying the request failed and may be retried ('The request "
         "failed, please retry')"),
    Rule("retryable.try_again_i18n", "retry_later",
         # Spanish
         r"(?:vuelve|vuelva|volver) a intentar(?:lo)?|int[ée]nt(?:alo|elo|a|e) (?:de nuevo|nuevamente"
         r"|m[áa]s tarde|otra vez)|intente (?:de nuevo|nuevamente|m[áa]s tarde|otra vez)"
         r"|reint[ée]nt(?:alo|elo|ar|a|e)|(?:prueba|pruebe|vuelve a probar) (?:de nuevo|otra vez|m[áa]s tarde)"
         # French
         r"|r[ée]essay(?:ez|er|e)|essayez (?:de nouveau|plus tard|à nouveau|ultérieurement)|retentez"
         # German
         r"|versuchen sie es [^.;!?]{0,40}?erneut|(?:sp[äa]ter |bitte |es )erneut (?:versuchen|probieren)"
         r"|versuche es [^.;!?]{0,30}?(?:erneut|nochmal|noch einmal)|erneut versuchen"
         r"|(?:noch einmal|nochmal) versuchen|probieren sie es [^.;!?]{0,30}?(?:später|erneut|nochmal|noch einmal)"
         # Portuguese
         r"|tente (?:novamente|de novo|mais tarde|outra vez)|tentar novamente|tentar de novo"
         # Japanese, Chinese, Korean (looked for anywhere)
         r"|再試行|もう一度お試し|再度お試し|後でお試し|しばらくしてから|時間をおいて|時間を置いて|後ほど"
         r"|しばらく待って|少し待って|やり直してください"
         r"|重试|重新尝试|再试一次|请稍后|请稍候|稍候再试|稍後再試|稍后再试|稍後重試|过会儿再试|請稍後"
         r"|다시 시도|재시도|잠시 후|잠시 뒤|나중에 다시",
         "docs/policy.md §13.6: 'try again' / 'retry' is retryable in any language the providers "
         "write it in: Spanish 'inténtalo de nuevo', French 'réessayez', German 'versuchen Sie es "
         "später erneut', Portuguese 'tente novamente', Japanese '再試行' / 'もう一度お試しください', "
         "Chinese '请重试' / '稍后再试', Korean '다시 시도해 주세요' (localized gateways and "
         "console front ends)"),
    Rule("retryable.rate_limit_i18n", "rate_limit",
         r"demasiadas (?:solicitudes|peticiones|consultas|llamadas)|(?:límite|limite) de (?:velocidad|tasa|solicitudes"
         r"|peticiones|frecuencia|concurrencia)|(?:solicitudes|peticiones) (?:simult[áa]neas|concurrentes)"
         r"|trop de (?:requêtes|requetes|demandes|appels)|limite de (?:débit|debit|taux|requêtes|requetes|fréquence"
         r"|concurrence)|requêtes simultanées"
         r"|zu viele (?:anfragen|anforderungen|requests|aufrufe|gleichzeitige)|ratenlimit|anfragelimit"
         r"|ratenbegrenzung|gleichzeitige(?:n)? (?:anfragen|anforderungen)"
         r"|muitas (?:solicitações|solicitacoes|requisições|requisicoes|requests|chamadas|pedidos)|limite de (?:taxa"
         r"|requisições|requisicoes|solicitações|concorrência)|(?:requisições|solicitações) simultâneas"
         r"|レート制限|リクエストが多すぎ|リクエスト数(?:の)?上限|リクエスト制限|リクエスト過多|アクセス過多"
         r"|同時(?:実行|接続|リクエスト)数|同時リクエスト"
         r"|요청이 너무 많|요청 수가 너무 많|요청 과다|속도 제한|요청 한도|호출 한도|사용량 한도"
         r"|동시 (?:요청|실행|접속)",
         "rate-limit wording in the providers' and gateways' other languages (Spanish, French, "
         "German, Portuguese, Japanese, Korean; Chinese in retryable.cn_rate_limit): 'too many "
         "requests', 'rate limit'"),
    Rule("retryable.overloaded_i18n", "overloaded",
         r"sobrecargad[oa]|surcharg[ée]e?|überlastet|uberlastet|ueberlastet|sobrecarregad[oa]"
         r"|servidor (?:está )?(?:ocupado|saturado)|serveur (?:est )?(?:occupé|saturé)|(?:server|dienst) (?:ist )?ausgelastet"
         r"|過負荷|混雑|混み合|サーバーが(?:ビジー|混雑)|アクセスが集中|高負荷|服务器繁忙|系统繁忙|负载过高|服務繁忙|访问量过大|訪問量過大"
         r"|系统(?:太|过于)忙|算力不足|模型(?:正在)?加载中"
         r"|과부하|혼잡|서버가 바쁩|트래픽이 많",
         "'overloaded' / 'busy' in Spanish, French, German, Portuguese, Japanese, Chinese, Korean"),
    Rule("retryable.retry_delay", "retry_later",
         r"retry[ _-]?delay|retry[ _-]?after(?:[ _-]?ms)?\\?[\"']?\s?[:=]|retry (?:in|after) \d"
         r"|try again (?:in|after) \d|please wait \d|try again later|retry later"
         r"|(?:try again|retry|wait) (?:in |after |for )?(?:about|approximately|around|roughly|~) ?\d",
         "the base family 'retry delay' phrasing; Google RetryInfo retryDelay; retry-after headers; "
         "Azure 'Please retry after N seconds'; Copilot 'Please wait N seconds'; approximate waits "
         "('Wait ~30s before retrying', 'try again in about 30 seconds': a hint of 30 s, docs/policy.md §2)"),
)


# --------------------------------------------------------------------------------------------
# Typed error codes and statuses (the structured path)

_ERROR_CODE_RULES: tuple[tuple[str, str, str, str], ...] = (
    # (code or type, kind, family, source)
    ("context_length_exceeded", "context_overflow", "overflow", "OpenAI error.code"),
    ("model_context_window_exceeded", "context_overflow", "overflow", "z.ai, Codex"),
    ("context_window_exceeded", "context_overflow", "overflow", "Codex, routers"),
    ("request_too_large", "context_overflow", "overflow", "Anthropic 413 error.type"),
    ("string_above_max_length", "context_overflow", "overflow", "OpenAI error.code"),
    ("prompt_too_long", "context_overflow", "overflow", "routers"),
    ("max_prompt_tokens_exceeded", "context_overflow", "overflow", "GitHub Copilot"),
    ("model_max_prompt_tokens_exceeded", "context_overflow", "overflow", "GitHub Copilot"),
    ("exceed_context_size_error", "context_overflow", "overflow", "llama.cpp error.type"),
    ("insufficient_quota", "permanent", "billing", "OpenAI 429 error.code/type (D1)"),
    ("billing_hard_limit_reached", "permanent", "billing", "OpenAI error.code"),
    ("billing_not_active", "permanent", "billing", "OpenAI error.code"),
    ("insufficient_balance", "permanent", "billing", "DeepSeek, Moonshot"),
    ("insufficient_credits", "permanent", "billing", "OpenRouter, xAI"),
    ("arrearage", "permanent", "billing", "DashScope error.code Arrearage"),
    ("payment_required", "permanent", "billing", "HTTP 402 as a code"),
    ("overloaded_error", "retryable", "overloaded", "Anthropic 529 error.type"),
    ("overloaded", "retryable", "overloaded", "routers"),
    ("server_overloaded", "retryable", "overloaded", "routers"),
    ("engine_overloaded", "retryable", "overloaded", "OpenAI legacy"),
    ("rate_limit_exceeded", "retryable", "rate_limit", "OpenAI 429 error.code"),
    ("rate_limit_error", "retryable", "rate_limit", "Anthropic 429 error.type"),
    ("rate_limited", "retryable", "rate_limit", "routers"),
    ("too_many_requests", "retryable", "rate_limit", "routers, Azure"),
    ("resource_exhausted", "retryable", "rate_limit", "Google status RESOURCE_EXHAUSTED"),
    ("throttlingexception", "retryable", "rate_limit", "Bedrock ThrottlingException"),
    ("serviceunavailableexception", "retryable", "server_error", "Bedrock ServiceUnavailableException"),
    ("internalserverexception", "retryable", "server_error", "Bedrock InternalServerException"),
    ("modelnotreadyexception", "retryable", "overloaded", "Bedrock ModelNotReadyException"),
    ("modeltimeoutexception", "retryable", "timeout", "Bedrock ModelTimeoutException"),
    ("modelstreamerrorexception", "retryable", "network", "Bedrock ModelStreamErrorException"),
    ("accessdeniedexception", "fatal", "auth", "Bedrock AccessDeniedException"),
    ("tool_use_failed", "retryable", "model_output", "Groq 400 code tool_use_failed (docs/policy.md §2)"),
    ("json_validate_failed", "retryable", "model_output", "Groq 400 code json_validate_failed"),
    ("usage_limit_reached", "usage_limit", "usage_limit", "Codex/ChatGPT plans"),
    ("usage_limit_exceeded", "usage_limit", "usage_limit", "subscription plans"),
    ("limit_reached", "usage_limit", "usage_limit", "subscription plans"),
    ("api_error", "retryable", "server_error", "Anthropic 500 error.type"),
    ("server_error", "retryable", "server_error", "OpenAI error.type (D3)"),
    ("internal_error", "retryable", "server_error", "Google status INTERNAL, routers"),
    ("internal_server_error", "retryable", "server_error", "routers"),
    ("service_unavailable", "retryable", "server_error", "OpenAI error.code"),
    ("unavailable", "retryable", "server_error", "Google status UNAVAILABLE"),
    ("bad_gateway", "retryable", "server_error", "gateways"),
    ("gateway_timeout", "retryable", "timeout", "gateways"),
    ("timeout", "retryable", "timeout", "OpenAI error.type"),
    ("timeout_error", "retryable", "timeout", "Anthropic 504 error.type"),
    ("request_timeout", "retryable", "timeout", "routers"),
    ("deadline_exceeded", "retryable", "timeout", "Google status DEADLINE_EXCEEDED"),
    ("authentication_error", "fatal", "auth", "Anthropic 401 error.type"),
    ("permission_error", "fatal", "auth", "Anthropic 403 error.type"),
    ("invalid_api_key", "fatal", "auth", "OpenAI 401 error.code"),
    ("permission_denied", "fatal", "auth", "Google status PERMISSION_DENIED"),
    ("unauthenticated", "fatal", "auth", "Google status UNAUTHENTICATED"),
    ("not_found_error", "fatal", "not_found", "Anthropic 404 error.type"),
    ("model_not_found", "fatal", "not_found", "OpenAI 404 error.code"),
    ("unsupported_country_region_territory", "fatal", "region", "OpenAI 403 error.code"),
    ("content_policy_violation", "fatal", "content_policy", "OpenAI error.code"),
    ("invalid_prompt", "fatal", "content_policy", "OpenAI error.code"),
)
"""Typed error codes and types (``error.code``, ``error.type``, Google's ``status``; compared
lower-cased) and their verdict: ``context_overflow``, ``permanent`` (a billing condition, which
outranks statuses), ``retryable``, ``usage_limit`` (retryable, a usage limit) or ``fatal``.
Generic types such as ``invalid_request_error`` decide nothing: the status and the text do."""
ERROR_CODES: dict[str, tuple[str, str, str]] = {code: (kind, family, source)
                                                for code, kind, family, source in _ERROR_CODE_RULES}

RETRYABLE_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504, 520, 521, 522, 523, 524, 529})
"""HTTP statuses that are transient by themselves (the status markers of the text rules, plus
425 Too Early)."""
FATAL_STATUSES = frozenset(n for n in range(400, 500) if re.fullmatch(_CLIENT_4XX, str(n)))
"""4xx statuses that are never worth retrying as such (the text rule ``fatal.client_status``)."""
# 402 is a billing condition; 413 means the request is too large: both outrank the others.


_FAMILY_OF_RULE = {rule.id: rule.family for table in (OVERFLOW_RULES, PERMANENT_RULES, STATUS_RULES,
                                                     USAGE_LIMIT_RULES, RETRYABLE_RULES, INWORD_RULES)
                   for rule in table}


def family_of_rule(rule_id: str) -> str | None:
    """The family of the table rule ``rule_id``, or None when no table has it."""
    return _FAMILY_OF_RULE.get(rule_id)


def family_of_status(status: int) -> str:
    """The family an HTTP status means by itself (RFC 9110 §15; 529 is Anthropic's overloaded):
    ``overloaded``, ``rate_limit``, ``timeout`` (408), ``billing`` (402), ``overflow`` (413),
    ``auth`` (401, 403), ``not_found`` (404), ``invalid_request`` (other 4xx), ``retry_later``
    (425), ``server_error`` (5xx), else ``other``."""
    special = {529: "overloaded", 429: "rate_limit", 408: "timeout", 402: "billing", 413: "overflow",
               401: "auth", 403: "auth", 404: "not_found", 425: "retry_later"}
    if status in special:
        return special[status]
    if 400 <= status < 500:
        return "invalid_request"
    return "server_error" if 500 <= status < 600 else "other"
