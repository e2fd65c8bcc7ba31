"""Classifying the end of a turn: ``retryable``, ``context_overflow``, ``fatal`` or ``none``.

Pure functions, no I/O (docs/policy.md §2). :func:`classify` decides from the text alone, in a
fixed order:

1. stop reason is not ``"error"`` → ``none`` (rule ``stop_reason.not_error``);
2. no error message (``None``, empty or blank) → ``fatal`` (``error.no_message``);
3. context overflow → ``context_overflow``: a rule of :data:`OVERFLOW_RULES`, or the silent
   overflow ``usage.input + usage.cache_read > context_window`` (``overflow.silent_usage``,
   only when ``context_window > 0``). A 429 is rate limiting, never overflow: a message that
   names a 429 status, "too many requests" or throttling skips this step — unless it says that
   this one request is larger than the limit itself (``overflow.request_above_limit``);
4. permanent conditions that only look transient → ``fatal`` (:data:`PERMANENT_RULES`, **D1**):
   billing and credit exhaustion (also in Chinese), quotas whose limit is 0, invalid keys, TLS
   trust failures, a runtime out of memory… even inside a "500"/"Server Error" wrapper;
5. status markers (:data:`STATUS_RULES`): the innermost (last) HTTP status the text names
   decides — a permanent 4xx → ``fatal``, 408/429/5xx/529 → ``retryable`` — so a 400 that wraps
   an upstream 429 is retried and a 502 that wraps a 404 is not;
6. the retryable families → ``retryable`` (:data:`RETRYABLE_RULES`, :data:`USAGE_LIMIT_RULES`,
   then :data:`INWORD_RULES`; **D2** network transients, **D3** standalone status numbers);
7. anything else → ``fatal`` (``fatal.unmatched``).

:func:`classify_facts` / :func:`classify_message` put the structured facts of a failed
response first (HTTP status, error type/code, headers; precedence in their docstring), and fall
back on the same text rules, so both paths agree on what the text says.

The rule tables are data: one :class:`Rule` per row with its id (reported in
:attr:`Classification.rule`, **D4**), family, regex and where it comes from. Patterns match the
*normal form* of the message (:func:`fsm.core.hints.normalize_text`): lower case, whitespace runs
collapsed to one space, ``\\n`` escapes of doubly encoded JSON as spaces, curly quotes
straightened, URLs removed. So write patterns in lower case, with single spaces, without
capturing groups (use ``(?:…)``), and start every alternative with a literal character (the
engine skips positions by their first two characters; the tests check it). Every pattern must
run in linear time: no nested unbounded quantifiers, and bounded gaps (``.{0,40}``) between
parts.

Rules match at word starts only, i.e. after a character that is not a letter, a digit or ``_``
(``ratelimit`` counts in ``x-ratelimit-reset``, ``503`` does not in ``req_503``), except rules
marked ``anywhere`` and those for scripts written without spaces (Chinese), which are looked
for anywhere when no word-start rule of their step matched. Within one step the leftmost match
decides (the innermost for status markers); the usage-limit flag and the retry hint are looked
for in the whole message. The text is read whole, before any clipping, in linear time. How the
tables become one fast regex: the comment "Compiling the tables" below.

To add a provider's phrasing: add a row to the right table (a new family if needed) with its
source, add the message to a ``tests/data/provider-errors*.jsonl`` corpus file or to the unit
tests of that family, and run ``pytest tests/core/test_classify.py``. A rule must describe a family
of messages, not copy one; docs/classification.md lists the families.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from collections.abc import Mapping

from fsm.core.hints import (
    HINT_TRIGGERS,
    WORD_CHARS,
    _normalize,
    header_hint,
    parse_hint_at,
    parse_normalized_hint_ms,
    parse_retry_hint_ms,
    should_retry_header,
)
from fsm.core.messages import AssistantMessage, Usage

__all__ = [
    "Classification",
    "FAMILIES",
    "family_of",
    "ERROR_CODES",
    "FATAL_STATUSES",
    "INWORD_RULES",
    "Kind",
    "OVERFLOW_RULES",
    "PERMANENT_RULES",
    "RETRYABLE_RULES",
    "RETRYABLE_STATUSES",
    "Rule",
    "STATUS_RULES",
    "USAGE_LIMIT_RULES",
    "classify",
    "classify_facts",
    "classify_message",
]

Kind = Literal["retryable", "context_overflow", "fatal", "none"]
KINDS: tuple[str, ...] = ("retryable", "context_overflow", "fatal", "none")
"""The values of :data:`Kind`."""


@dataclass(frozen=True, slots=True)
class Rule:
    """One row of a pattern table.

    ``id``: stable, dotted, prefixed by the outcome (``overflow.``, ``fatal.``, ``retryable.``),
    e.g. ``"retryable.overloaded"``; reported as :attr:`Classification.rule`. ``family``: the
    group of conditions it belongs to (``"overloaded"``, ``"rate_limit"``, ``"server_5xx"``,
    ``"network"``, ``"context_overflow"``, ``"billing"``…). ``pattern``: regex source text,
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


@dataclass(frozen=True, slots=True)
class Classification:
    """How a turn ended.

    ``kind``: one of ``"retryable"``, ``"context_overflow"``, ``"fatal"``, ``"none"``.
    ``rule``: the id of the rule that decided — a :class:`Rule` id, a structured fact
    (``"structured.status_529"``, ``"structured.code_insufficient_quota"``,
    ``"structured.type_overloaded_error"``, ``"structured.x_should_retry_false"``…, see
    :func:`classify_facts`), or one of the fixed steps ``"stop_reason.not_error"``,
    ``"error.no_message"``, ``"overflow.silent_usage"``, ``"fatal.unmatched"``.
    ``usage_limit``: the message is a usage-limit error (docs/policy.md §2 "Usage limits";
    only ever true for ``retryable``). ``retry_hint_ms``: the provider's retry hint in
    milliseconds (0 … 7 days), only for ``retryable``; ``None`` when the message has none.
    ``family``: the condition, one of the closed set :data:`FAMILIES` (docs/policy.md §13.6);
    derived from ``kind``, ``rule`` and ``usage_limit`` when not given. Settings that name
    families (``retry.fallbackOn``) are checked against :data:`FAMILIES`.
    """

    kind: Kind
    rule: str
    usage_limit: bool = False
    retry_hint_ms: int | None = None
    family: str = ""

    def __post_init__(self) -> None:
        if not self.family:
            object.__setattr__(self, "family", family_of(self.kind, self.rule, self.usage_limit))
        elif self.family not in FAMILIES:
            raise ValueError(f"family must be one of {', '.join(FAMILIES)}; got {self.family!r:.80}")


FAMILIES: tuple[str, ...] = (
    "overloaded", "rate_limit", "usage_limit", "server_error", "network", "stalled", "timeout",
    "overflow", "billing", "auth", "invalid_request", "content_policy", "model_not_found",
    "region", "resources", "other", "none",
)
"""The closed set of :attr:`Classification.family` values (docs/policy.md §13.6):
``overloaded`` (529, ``overloaded_error``, "overloaded" text such as OpenAI's 503), ``rate_limit``
(a plain 429), ``usage_limit`` (a plan's usage window), ``server_error`` (5xx), ``network``
(connection and transport errors), ``stalled`` (the stall watchdog), ``timeout`` (the attempt
timeout), ``overflow`` (context overflow, request too large), ``billing``, ``auth``,
``invalid_request`` (other 4xx), ``content_policy``, ``model_not_found``, ``region``,
``resources`` (the server could not load the model), ``other`` (nothing more specific) and
``none`` (the turn did not end in error)."""

_RULE_FAMILY_TO_FAMILY = {
    "server_5xx": "server_error", "context_overflow": "overflow", "request_size": "overflow",
    "client_4xx": "invalid_request", "retry_delay": "server_error", "server_verdict": "other",
    "tls_config": "network", "hint": "other",
}
_STATUS_FAMILY = {408: "timeout", 429: "rate_limit", 529: "overloaded", 401: "auth", 403: "auth",
                  402: "billing", 413: "overflow", 404: "model_not_found"}


def family_of(kind: str, rule: str, usage_limit: bool = False) -> str:
    """The :data:`FAMILIES` value of a verdict: ``kind``, the deciding ``rule`` id and the
    usage-limit flag (a usage limit outranks the rule's family; docs/policy.md §13.6)."""
    if kind == "none":
        return "none"
    if kind == "context_overflow":
        return "overflow"
    if usage_limit:
        return "usage_limit"
    if rule.startswith("structured."):
        name = rule[len("structured."):]
        for prefix in ("status_", "inner_status_"):
            if name.startswith(prefix) and name[len(prefix):].isdigit():
                status = int(name[len(prefix):])
                if status in _STATUS_FAMILY:
                    return _STATUS_FAMILY[status]
                return ("server_error" if status >= 500 else "invalid_request" if status >= 400
                        else "other")
        for prefix in ("code_", "type_"):
            if name.startswith(prefix):
                verdict = ERROR_CODES.get(name[len(prefix):])
                if verdict is not None:
                    family = verdict[1]
                    return _RULE_FAMILY_TO_FAMILY.get(family, family) if family else "other"
        return "server_error" if kind == "retryable" else "other"
    if not _RULE_FAMILIES:  # the rule tables exist by the first call (module constants below)
        for table in (OVERFLOW_RULES, PERMANENT_RULES, INWORD_RULES, STATUS_RULES,
                      USAGE_LIMIT_RULES, RETRYABLE_RULES):
            _RULE_FAMILIES.update((r.id, r.family) for r in table)
    found = _RULE_FAMILIES.get(rule)
    if found is None:
        return "other"
    family = _RULE_FAMILY_TO_FAMILY.get(found, found)
    return family if family in FAMILIES else "other"


_RULE_FAMILIES: dict[str, str] = {}


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
_CLIENT_4XX = r"4(?:0[0-7]|1[0-2]|1[4-8]|2[1-46-8]|31|51)(?![0-9])"

# --------------------------------------------------------------------------------------------
# Step 3: context overflow (handed to compaction, never retried)

OVERFLOW_RULES: tuple[Rule, ...] = (
    Rule("overflow.prompt_too_long", "context_overflow",
         r"prompt (?:\([0-9,]{1,12} tokens?\) )?(?:is )?too long",
         "Anthropic 'prompt is too long: N tokens > M maximum'; Fireworks; pi-mono overflow.ts; "
         "corpus anthropic-400-prompt-too-long-json"),
    Rule("overflow.input_too_long", "context_overflow",
         r"input (?:prompt )?(?:\([0-9,]{1,12} tokens?\) )?(?:is )?too long",
         "Amazon Bedrock 'Input is too long for requested model' (ValidationException); "
         "corpus bedrock-*-input-too-long"),
    Rule("overflow.exceeds_context", "context_overflow",
         r"exceed(?:s|ed|ing)? (?:(?:the|this|your|its|a|model's|model|available|maximum|max|allowed"
         r"|configured) ){0,3}"
         r"context(?: |_|-)?(?:window|length|size|limit)",
         "OpenAI Responses 'Your input exceeds the context window of this model'; Anthropic "
         "'input length and max_tokens exceed context limit' and 413 'Request size exceeds model "
         "context window'; llama.cpp 'exceeds the available context size'; Ollama 'input length "
         "exceeds the context length'; docs/policy.md §2"),
    Rule("overflow.context_window_exceeds", "context_overflow",
         r"context (?:window|length|size) (?:exceeds?|exceeded|overflow)",
         "MiniMax 'context window exceeds limit'; pi-mono overflow.ts"),
    Rule("overflow.max_context_length", "context_overflow",
         r"maximum context length (?:is |of )?\d|too large for model with \d",
         "OpenAI/Azure/DeepSeek/vLLM/OpenRouter \"This model's maximum context length is N "
         "tokens\"; Mistral 'too large for model with N maximum context length'; docs/policy.md §2"),
    Rule("overflow.token_count_exceeds", "context_overflow",
         r"token count (?:of )?(?:\(?[0-9,]{1,12}\)? )?exceeds? (?:the )?(?:max|limit)",
         "Gemini/Vertex 'The input token count (N) exceeds the maximum number of tokens allowed'; "
         "GitHub Copilot 'prompt token count of N exceeds the limit of M'; docs/policy.md §2"),
    Rule("overflow.input_tokens_exceed", "context_overflow",
         r"(?:input|prompt) tokens? (?:count )?exceed(?:s|ed)? (?:the )?(?:configured |maximum "
         r"|max )?(?:limit|context)",
         "OpenAI Codex 'Input tokens exceed the configured limit of N tokens'"),
    Rule("overflow.length_exceeds", "context_overflow",
         r"(?:input|prompt) length (?:exceeds?|exceeded) (?:the )?(?:max|limit|context)"
         r"|exceeds? (?:the )?max(?:imum)? (?:allowed )?(?:input|prompt|sequence) length",
         "AI21/Cohere/Ollama 'prompt length exceeds maximum', 'exceeds the maximum input length'"),
    Rule("overflow.longer_than_context", "context_overflow",
         r"(?:greater|larger|longer) than (?:the )?(?:max(?:imum)? )?(?:context (?:length|size"
         r"|window)|model'?s? context length|maximum model length)",
         "LM Studio 'greater than the context length'; llama.cpp 'larger than the max context "
         "size'; vLLM 'is longer than the maximum model length'; docs/policy.md §2"),
    Rule("overflow.context_length_exceeded", "context_overflow",
         r"context[_ ]length[_ ]exceeded|model_context_window_exceeded|context_window_exceeded"
         r"|exceed_context_size_error"
         r"|model_max_prompt_tokens_exceeded|max_prompt_tokens_exceeded|prompt_too_long",
         "OpenAI code context_length_exceeded; llama.cpp type exceed_context_size_error; "
         "Copilot code model_max_prompt_tokens_exceeded; docs/policy.md §2; pi-mono overflow.ts"),
    Rule("overflow.lm_studio", "context_overflow",
         r"keep the first [0-9,]{1,12} tokens when context(?: the)? overflows|context length of only \d"
         r"|reached context length of \d|mid-generation context overflow",
         "LM Studio 'Trying to keep the first N tokens when context the overflows', 'loaded with "
         "context length of only N tokens', 'Reached context length of N tokens'"),
    Rule("overflow.reduce_length", "context_overflow",
         r"reduce the length of the (?:messages|prompt|input)",
         "Groq/OpenAI 'Please reduce the length of the messages'; pi-mono overflow.ts"),
    Rule("overflow.maximum_prompt_length", "context_overflow",
         r"maximum prompt length is \d",
         "xAI \"This model's maximum prompt length is N but the request contains M tokens\""),
    Rule("overflow.token_limit", "context_overflow",
         r"exceed(?:s|ed)? (?:the )?(?:model'?s? |model )?(?:max(?:imum)? )?token limit"
         r"|token limit exceeded(?! per)|(?:input|prompt) token limit",
         "Kimi 'exceeded model token limit'; VS Code LM API 'Message exceeds token limit'; "
         "docs/policy.md §2 'token limit exceeded'"),
    Rule("overflow.too_many_tokens", "context_overflow",
         r"too many (?:input |prompt )?tokens(?![,.:]? (?:please wait|per |processed|in the last))",
         "docs/policy.md §2 'too many tokens' (Cohere 'too many tokens: total number of tokens in the "
         "prompt cannot exceed'); not Bedrock/Cerebras throttling ('Too many tokens, please "
         "wait', 'per day', 'processed'; corpus bedrock-*, cerebras-tpm-too-many-tokens)"),
    Rule("overflow.tgi_inputs", "context_overflow",
         r"`inputs` (?:must have less than [0-9,]{1,12} tokens|tokens \+ `max_new_tokens` must be <=)",
         "Hugging Face TGI / Together 'Input validation error: `inputs` must have less than N "
         "tokens'; corpus tgi-*"),
    Rule("overflow.qwen_input_length_range", "context_overflow",
         r"range of input length should be",
         "Alibaba DashScope (Qwen) 'Range of input length should be [1, N]'"),
    Rule("overflow.request_above_limit", "request_size",
         r"request too large for|must be reduced in order to run successfully"
         r"|(?:request|input|prompt) (?:is |was )?(?:larger|bigger|greater) than (?:the |your |this )?"
         r"(?:per[ -]minute |rate |token |tpm )*limit",
         "docs/policy.md §2 v2: one request larger than a per-minute token limit can never succeed "
         "as it is, even inside a 429 (OpenAI/Groq 'Request too large for <model> … on tokens per "
         "min (TPM): Limit N, Requested M … must be reduced in order to run successfully')"),
    Rule("overflow.request_too_large", "request_size",
         r"request_too_large|request (?:entity |body |payload )?too large|payload too large"
         r"|request (?:size )?exceeds the maximum (?:allowed )?size|payload size exceeds the limit"
         r"|string_above_max_length",
         "Anthropic 413 request_too_large (32 MB); Groq 413 'Request too large for model'; "
         "GitHub Models 'Request body too large'; Gemini 'Request payload size exceeds the "
         "limit'. Byte limits, but shrinking the history is the only fix (corpus notes)"),
    Rule("overflow.bedrock_body_length", "request_size",
         r"'body' failed to satisfy constraint: member must have length",
         "Bedrock InvokeModel 25 MB body limit; corpus bedrock-validation-body-25000000"),
    Rule("overflow.max_input_length", "context_overflow",
         r"(?:longer|larger|greater) than (?:the |this |its )?(?:model'?s? )?max(?:imum)? "
         r"(?:allowed )?(?:input|prompt|sequence|model) length"
         r"|max(?:imum)? (?:allowed )?(?:input|prompt) length (?:is |of )?\d",
         "an input longer than the model's maximum input length (vLLM/TGI/embedding servers "
         "'is longer than the maximum input length', 'maximum input length of N tokens')"),
    Rule("overflow.cannot_truncate", "context_overflow",
         r"(?:cannot|can't|could not|couldn't|unable to|failed to) (?:be )?truncat(?:e|ed)"
         r"|truncation (?:failed|is not possible|impossible)",
         "a prompt that cannot be truncated to fit the context (local runtimes that refuse to "
         "drop the system prompt or the last message): shrinking the history is the fix"),
    Rule("overflow.status_no_body", "context_overflow",
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
         r"|out of credits|no credits (?:left|remaining)|credits? (?:have been |has been |are "
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
         "recharge; docs/policy.md §2 v2", anywhere=True),
    Rule("fatal.spending_limit", "billing",
         r"spending (?:limit|cap)|billing[_ ]hard[_ ]limit|billing_not_active|account is not active"
         r"|premium request allowance|you have no (?:remaining )?quota|trial (?:has )?(?:expired|ended)",
         "xAI 'reached its monthly spending limit' (corpus xai-*); OpenAI "
         "billing_hard_limit_reached / billing_not_active; Copilot 'exceeded your premium "
         "request allowance', 402 'You have no quota'"),
    Rule("fatal.should_not_retry", "server_verdict",
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
    Rule("fatal.model_load_failed", "resources",
         r"(?:failed|unable) to load (?:the )?model|(?:could not|couldn't|cannot|can't) load (?:the )?model"
         r"|error loading model|try a different model",
         "a local runtime that cannot load the model (LM Studio 'Failed to load the model … Try a "
         "different model and/or config', llama.cpp 'error loading model'): not the transient "
         "'Loading model' of a server still starting"),
    Rule("fatal.out_of_memory", "resources",
         r"(?:cannot|can't|could not|couldn't|unable to|failed to) allocate(?: [a-z_]{1,20}){0,3} "
         r"(?:memory|buffer)|out of memory|(?:requires|needs) more (?:system |gpu |video )?memory"
         r"|(?:insufficient|not enough) (?:system |gpu |video |available )?memory",
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
         r"|unauthori[sz]ed|unauthenticated|permission[_ -]?denied|permission_error"
         r"|access (?:is )?denied"
         r"|request_forbidden|no cookie auth credentials"
         r"|(?:account|organization|organisation) (?:has been |is |was )?(?:deactivated|disabled"
         r"|suspended|banned)"
         r"|(?:oauth|access|auth) token (?:has )?expired",
         "Anthropic authentication_error / permission_error; OpenAI 403 request_forbidden; "
         "Vertex PERMISSION_DENIED; OpenRouter 401 'No cookie auth credentials found'"),
    Rule("fatal.region_unsupported", "region",
         r"unsupported_country|country, region,? or territory not supported|user location is not supported"
         r"|not available in your (?:country|region)|unsupported[_ ]region",
         "OpenAI 403 unsupported_country_region_territory; Gemini 400 FAILED_PRECONDITION 'User "
         "location is not supported'"),
    Rule("fatal.tls_certificate", "tls_config",
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
    Rule("fatal.model_not_found", "model_not_found",
         r"model_not_found|not_found_error|does not exist or you do not have access"
         r"|model [\"'`][^\"'`]{1,100}[\"'`] (?:not found|does not exist|is not supported)"
         r"|try pulling it first|model (?:has been )?decommissioned|model_decommissioned|unknown model",
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
    Rule("retryable.inword_timeout", "network",
         r"timeout(?:error|exception)|timedout",
         "class names such as 'APITimeoutError', 'UpstreamTimeoutException'", anywhere=True),
)

# --------------------------------------------------------------------------------------------
# Status markers: HTTP statuses in the text. Within the text, the innermost (last) one decides
# over the families of step 5 (a 400 wrapping an upstream 429 is a 429; a 502 wrapping a 404
# is a 404); permanent conditions (step 4) and overflow (step 3) still come first.

STATUS_RULES: tuple[Rule, ...] = (
    Rule("fatal.client_status", "client_4xx",
         r"(?:status(?:[ _]?code)?|http(?:/[0-9.]{1,3})?|error(?:[ _]?code)?|code)"
         r"[:= \"'\\(\[]{0,4}" + _CLIENT_4XX,
         "an explicit 4xx status (400-407, 410-418 but 413, 421-428 but 425, 431, 451) is not "
         "transient even inside a 'Server Error:' or 'InternalServerError' wrapper; corpus "
         "openai-401-server-error-prefix, hermes-openrouter-401-attempt-1-of-3"),
    Rule("fatal.client_status_phrase", "client_4xx",
         r"400 bad request|401 unauthorized|403 forbidden|404 not found|405 method not allowed"
         r"|406 not acceptable|410 gone|415 unsupported media type|422 unprocessable (?:entity|content)",
         "HTTP reason phrases of permanent 4xx statuses (RFC 9110 §15.5)"),
    Rule("fatal.client_status_leading", "client_4xx",
         r"^" + _CLIENT_4XX,
         "a message that starts with a permanent 4xx status (Node SDK '404 The model …', "
         "'401 Incorrect API key provided')"),
    Rule("fatal.not_found", "client_4xx",
         r"not[ _]found(?<!host not found)(?<!host not_found)",
         "a bare 'Not Found' (the reason phrase of 404) inside a gateway's 502 or a wrapper: the "
         "innermost verdict is a missing route or model; not DNS 'host not found'"),
    Rule("retryable.status_529", "overloaded",
         _status("529"),
         "Anthropic 529 Overloaded; D2"),
    Rule("retryable.status_429", "rate_limit",
         _status("429"),
         "HTTP 429 Too Many Requests (RFC 6585); base families (docs/policy.md §2); D3"),
    Rule("retryable.status_5xx", "server_5xx",
         _status("5(?:0[0234]|2[0-4])"),
         "the base 500/502/503/504 and Cloudflare 520-524; D3 standalone numbers"),
    Rule("retryable.status_408", "network",
         _status("408"),
         "HTTP 408 Request Timeout"),
    Rule("retryable.typed_transient", "server_5xx",
         r"serviceunavailableexception|internalserverexception|modelnotreadyexception"
         r"|modeltimeoutexception|modelstreamerrorexception|throttlingexception"
         r"|overloaded_error|rate_limit_error|rate_limit_exceeded",
         "a provider's typed verdict named in the text (Bedrock ':exception-type' "
         "serviceUnavailableException/ThrottlingException, Anthropic overloaded_error/"
         "rate_limit_error, OpenAI rate_limit_exceeded): like a status, the innermost decides, "
         "so a 400 event-stream frame whose exception type is transient is retried"),
    Rule("retryable.should_retry", "server_verdict",
         r"x-should-retry: ?true",
         "the server's own verdict in the x-should-retry response header (OpenAI and Anthropic "
         "APIs), as fsm.providers.sdk_errors appends it to an error text"),
)

# Rules that stand down when the message also carries a retry hint and no other permanent
# rule matches.
_YIELDS_TO_HINT = frozenset({"fatal.exceeded_current_quota"})

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
    Rule("retryable.quota_window", "usage_limit",
         r"(?:requests?|tokens?|calls?) per (?:day|hour)\b|per[ _-](?:day|hour)\b|free-models-per-day"
         r"|rp[dh](?![a-z0-9_])|tp[dh](?![a-z0-9_])|daily[ _-]?(?:quota|limit|request limit"
         r"|token limit)|(?:hourly|daily) (?:usage|rate) limit",
         "docs/policy.md §2 v2: quota windows are usage limits (OpenAI 'requests per day (RPD)', "
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
         r"|high demand|server (?:is )?(?:too )?busy"
         r"|too busy|maximum pending requests|(?:model|engine) is (?:currently )?(?:loading"
         r"|warming up|not ready)"
         r"|is currently loading|loading model|model_not_ready|modelnotready",
         "Google MODEL_CAPACITY_EXHAUSTED 'No capacity available'; Mistral 'Service tier "
         "capacity exceeded'; Gemini 'high demand'; Ollama 'server busy … maximum pending "
         "requests'; Hugging Face 503 'Model … is currently loading'; Bedrock "
         "ModelNotReadyException; llama.cpp 503 'Loading model'"),
    # rate limits
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
         r"请求过于频繁|请求太频繁|速率限制|频率限制|限流|服务繁忙|负载已?饱和|稍后再试|稍后重试",
         "Chinese gateways (one-api/new-api, Copilot zh-CN): 'requests too frequent', 'rate "
         "limit', 'busy', 'load saturated', 'try again later'"),
    # HTTP-like server classes and their names
    Rule("retryable.gateway_relay", "server_5xx",
         r"(?:could not|couldn't|unable to|failed to|cannot|can't) (?:relay|forward|proxy|reach|contact)"
         r" (?:the |your |this )?(?:request |message |call )?(?:to )?(?:the )?(?:upstream|backend"
         r"|origin|provider|model server)"
         r"|error (?:while )?(?:relaying|forwarding|proxying)|(?:relay|forward|proxy)(?:ing)? "
         r"(?:error|failed|failure)"
         r"|upstream (?:request |call |connection )?(?:error|failure|failed|unavailable|returned an? "
         r"error|service unavailable|provider (?:error|failed))|error from (?:the )?upstream"
         r"|provider returned error",
         "a gateway or router that could not relay the request upstream (LiteLLM/one-api/new-api "
         "'failed to forward request', OpenRouter 'Provider returned error', envoy/nginx "
         "'upstream error'); a permanent condition or a 4xx inside still decides"),
    Rule("retryable.service_unavailable", "server_5xx",
         r"service[ _]?(?:is )?(?:temporarily )?unavailable|temporarily unavailable"
         r"|temporarily unable to process|(?:is|are) (?:currently )?unable to (?:process|handle|serve)"
         r" (?:your|the|this) request"
         r"|status\\?[\"']?:? ?\\?[\"']?unavailable\b|statuscode\.unavailable|bad ?gateway"
         r"|gateway ?time-?out"
         r"|origin (?:is )?unreachable|no healthy upstream",
         "base families (docs/policy.md §2); Bedrock ServiceUnavailableException; Google status UNAVAILABLE; gRPC "
         "StatusCode.UNAVAILABLE; nginx/Cloudflare 502/504 pages; envoy"),
    Rule("retryable.server_error", "server_5xx",
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
         r"|err_connection_",
         "the base family 'connection error'; D2 connection reset/refused/closed; OpenAI and "
         "Anthropic SDK APIConnectionError 'Connection error.'; httpx ConnectError; asyncio "
         "'Connect call failed'; aiohttp ClientConnectorError"),
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
         r"|temporary failure in name resolution|getaddrinfo",
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
         r"terminated(?<!been terminated)(?<!was terminated)(?<!is terminated)",
         "D2 'terminated' (undici 'TypeError: terminated' when the body stream dies); "
         "not 'account has been terminated'"),
    Rule("retryable.websocket", "network",
         r"web ?socket(?:[ _-]?(?:error|exception|closed?|disconnect(?:ed)?|fail(?:ed|ure)|timeout"
         r"|timed out|protocol error|connection (?:closed|failed|lost|error|reset)|is (?:not open"
         r"|closed))|(?: connection)?(?: to .{0,120}?)? (?:failed|closed|error|was closed|lost)"
         r"|(?: [a-z]{1,20})? (?:communication|connection) (?:error|failed|closed|lost))"
         r"|no close frame|abnormal closure",
         "docs/policy.md §2 v2: WebSocket errors are transport failures (browsers 'WebSocket "
         "connection to … failed', websockets ConnectionClosedError, Codex/Realtime 'WebSocket "
         "closed', ws 'WebSocket is not open')"),
    Rule("retryable.no_response", "network",
         r"ended without (?:a |an )?(?:finish|response|message_stop|\[done\]|stop)"
         r"|did not get a response|no response (?:was )?(?:received|from (?:the )?(?:server|upstream))"
         r"|empty reply from server|stream ended before",
         "a stream or request that ended without an answer: HTTP/2 'request did not get a "
         "response', curl 'Empty reply from server', 'stream ended before message_stop'"),
    Rule("retryable.stream_stalled", "stalled",
         r"stream stalled",
         "the stall watchdog's own words (docs/policy.md §13.1): 'stream stalled: no response "
         "within 30 s', 'stream stalled: no data for 60 s'"),
    Rule("retryable.attempt_timeout", "timeout",
         r"attempt timed out after",
         "the attempt timeout's own words (docs/policy.md §13.2): 'attempt timed out after 120 s'"),
    Rule("retryable.timeout", "network",
         r"timed?[ _-]?out|deadline[ _]?exceeded|(?:read|connect|write|pool|headers|body|api|model)timeout",
         "D2 'timed out'; undici HeadersTimeoutError; httpx ReadTimeout; litellm Timeout "
         "/ APITimeoutError; gRPC/Google 504 DEADLINE_EXCEEDED; Bedrock ModelTimeoutException"),
    Rule("retryable.stream_finish_error", "network",
         r"finish_reason\\?[\"']?:? ?\\?[\"']?error\b",
         "OpenRouter and other routers end a stream with finish_reason 'error' when the upstream "
         "provider fails mid-generation; our provider reports it as 'The provider ended the "
         "stream with finish_reason: error'"),
    # the provider says when (or that) to retry
    Rule("retryable.try_request_again", "retry_delay",
         r"(?:please try|try) (?:your|the|this) request again(?! with| using)"
         r"|(?:please retry|retry) (?:your|the|this) request(?! with| using)"
         r"|you (?:can|may|should) retry(?! with| using)|try again (?:shortly|soon|momentarily"
         r"|in a (?:few|moment|little|bit))",
         "docs/policy.md §2 v2: provider text that asks to try the request again (OpenAI 'You can "
         "retry your request', Anthropic/Gemini 'An unexpected error occurred. Please try your "
         "request again', 'try again shortly')"),
    Rule("retryable.retry_delay", "retry_delay",
         r"retry[ _-]?delay|retry[ _-]?after(?:[ _-]?ms)?\\?[\"']?\s?[:=]|retry (?:in|after) \d"
         r"|try again (?:in|after) \d|please wait \d|try again later|retry later",
         "the base family 'retry delay' phrasing; Google RetryInfo retryDelay; retry-after headers; "
         "Azure 'Please retry after N seconds'; Copilot 'Please wait N seconds'"),
)

# --------------------------------------------------------------------------------------------
# Compiling the tables
#
# Python's regex engine tries every alternative of a big alternation at every position: ~50 µs
# for a 200-character message and ~1 s for a megabyte. So the tables are compiled into one
# regex of the shape
#
#     [^a-z0-9_…](?=[<1st chars>][<2nd chars>])(?:o(?:verloaded()|…)|r(?:ate(?=[ _-]?limit)()|…)|…)
#
# - every rule matches at a word start, so the regex starts with one non-word character
#   (:data:`_BOUNDARY`) and the engine skips letters and digits in C; the lookahead cheaply
#   rejects boundaries followed by a quote or a space, and one-letter words. The text gets a
#   leading space so that position 0 is a word start too; ``^``-anchored alternatives are
#   matched once, at the start, by a separate small regex. Words of scripts written without
#   spaces (Chinese) are searched separately;
# - the alternatives of every rule (a leading ``(?:a|b)`` distributed) form a trie over their
#   literal prefixes, so one character comparison rejects a whole subtree; at every branch,
#   overflow rules come first, then permanent ones, so no later step can hide them;
# - retryable rules and the hint trigger words are *peeks*: they consume their first word only
#   (the rest is a lookahead), so they never hide a match that starts at a later word;
# - each alternative ends with an empty group: ``m.lastindex`` maps back to the rule.
#
# One ``finditer`` over this regex answers every question of :func:`classify` in one pass over
# the text. Past 48 matches (adversarial repetitions) :func:`_continue` takes over: one
# ``search`` per question still open, each resuming where the last stopped, with smaller
# regexes built the same way on first use. Either way the text is read about once.

_SPECIAL = frozenset(".^$*+?{}[]\\|()")
# A character that may precede a word: not a letter or digit (Latin, Greek, Cyrillic, CJK,
# kana, Hangul) nor `_`. Spelled out: a class of ranges is checked faster than \W.
_BOUNDARY = f"[^{WORD_CHARS}]"
_OVERFLOW, _PERMANENT, _RETRYABLE, _HINT = 0, 1, 2, 3


def _scan(pattern: str, i: int, stop_at_bar: bool) -> int:
    """Index of the ``|`` at depth 0 (``stop_at_bar``) or of the ``)`` closing the group that
    opens at ``i``; ``len(pattern)`` when there is none."""
    depth, in_class = 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0 and not stop_at_bar:
                return i
        elif ch == "|" and depth == 0 and stop_at_bar:
            return i
        i += 1
    return i


def _alternatives(pattern: str) -> list[str]:
    """Top-level alternatives of ``pattern``; a leading ``(?:a|b)rest`` becomes ``arest``,
    ``brest`` (recursively), unless a quantifier follows the group."""
    parts, start = [], 0
    while True:
        end = _scan(pattern, start, True)
        parts.append(pattern[start:end])
        if end >= len(pattern):
            break
        start = end + 1
    out: list[str] = []
    for alt in parts:
        if alt.startswith("(?:"):
            close = _scan(alt, 0, False)
            if close + 1 >= len(alt) or alt[close + 1] not in "?*+{":
                rest = alt[close + 1:]
                out.extend(a for inner in _alternatives(alt[3:close]) for a in _alternatives(inner + rest))
                continue
        out.append(alt)
    return out


def _literal_prefix(alt: str) -> list[str]:
    """The leading literal characters of ``alt`` as regex source units (``a``, ``\\(``)."""
    units, i = [], 0
    while i < len(alt):
        if alt[i] == "\\":
            if i + 1 >= len(alt) or alt[i + 1].isalnum():
                break
            unit = alt[i:i + 2]
        elif alt[i] in _SPECIAL:
            break
        else:
            unit = alt[i]
        nxt = i + len(unit)
        if nxt < len(alt) and alt[nxt] in "?*+{":
            break  # the quantifier applies to this character
        units.append(unit)
        i = nxt
    return units


class _Trie:
    """Alternatives keyed by their literal prefix; ``rank`` orders siblings (lowest first)."""

    __slots__ = ("children", "ends", "rank")

    def __init__(self) -> None:
        self.children: dict[str, _Trie] = {}
        self.ends: list[tuple[int, str, int]] = []  # (rank, rest, owner)
        self.rank = 99

    def add(self, units: list[str], rest: str, owner: int, rank: int) -> None:
        node = self
        node.rank = min(node.rank, rank)
        for unit in units:
            node = node.children.setdefault(unit, _Trie())
            node.rank = min(node.rank, rank)
        node.ends.append((rank, rest, owner))

    def emit(self, owners: list[int]) -> str:
        parts: list[tuple[int, int, str | tuple[str, _Trie] | tuple[str, int]]] = []
        for order, (unit, child) in enumerate(self.children.items()):
            parts.append((child.rank, order, (unit, child)))
        for order, (rank, rest, owner) in enumerate(self.ends, len(parts)):
            parts.append((rank, order, (rest, owner)))
        parts.sort(key=lambda p: (p[0], p[1]))  # stable: by rank, then insertion order
        texts = []
        for _, _, (head, item) in parts:
            if isinstance(item, _Trie):
                texts.append(head + item.emit(owners))
            else:
                texts.append(head + "()")
                owners.append(item)
        return texts[0] if len(texts) == 1 else "(?:" + "|".join(texts) + ")"


def _char_filter(trie: _Trie) -> str:
    """A lookahead for the first two characters a match can start with: it rejects, before any
    alternative is tried, boundaries followed by a quote or a space and one-letter words.
    Conservative where an alternative's second character is not a literal."""
    if trie.ends:  # pragma: no cover - every table alternative starts with a literal
        return ""
    firsts, seconds = set(), set()
    for unit, child in trie.children.items():
        firsts.add(unit[-1])
        seconds.update(u[-1] for u in child.children)
        if child.ends:
            seconds.update("0123456789" if unit[-1].isdigit() else "abcdefghijklmnopqrstuvwxyz0123456789")
    def cls(chars: set[str]) -> str:
        return "[" + "".join(re.escape(c) for c in sorted(chars)) + "]"
    return f"(?={cls(firsts)}{cls(seconds)})"


def _peek(alt: str) -> str:
    """``alt`` consuming only its first word (up to the first space of its literal prefix), the
    rest as a lookahead."""
    units = _literal_prefix(alt)
    if " " in units:
        units = units[:units.index(" ")]
    head = "".join(units)
    rest = alt[len(head):]
    return head + (f"(?={rest})" if rest else "")


def _may_hide_a_trigger(literal: str) -> bool:
    """Whether an alternative whose literal prefix is ``literal`` can match where a hint
    trigger word (:data:`fsm.core.hints.HINT_TRIGGERS`) starts."""
    return any(literal.startswith(w) or w.startswith(literal) for w in HINT_TRIGGERS)


def _compile(entries: list[tuple[int, Rule]], peek: frozenset[int]) -> tuple[
        re.Pattern[str], re.Pattern[str] | None, tuple[tuple[int, Rule, bool], ...]]:
    """The scan regex for ``(tag, rule)`` entries (tags in ``peek`` as peeks), the regex of
    their ``^``-anchored alternatives (matched once, at the start), and per marker group
    (``m.lastindex - 1``, the same numbering for both) ``(tag, rule, starts_with_a_trigger)``."""
    trie = _Trie()
    anchored: list[tuple[str, int]] = []
    info: list[tuple[int, Rule, bool]] = []
    for tag, rule in entries:
        if rule.anywhere:
            continue  # looked for anywhere instead: see _anywhere()
        for alt in _alternatives(rule.pattern):
            if alt[:1] > "\x7f":
                continue  # a word in a script without spaces: see _anywhere()
            units = _literal_prefix(alt.lstrip("^"))
            literal = "".join(u[-1] for u in units)
            # where a hint may start: a trigger word, or a retryable alternative (a peek) whose
            # first word could also be the start of a trigger word ("ratelimit" in
            # "x-ratelimit-reset: 20", "retry after 30s"): at one position only one
            # alternative matches, so such a match must report the position itself
            trigger = tag == _HINT or (tag == _RETRYABLE and _may_hide_a_trigger(literal))
            info.append((tag, rule, trigger))
            if alt.startswith("^"):
                anchored.append((alt[1:], len(info) - 1))
                continue
            if tag in peek or (tag == _PERMANENT and rule.id in _STATUS_IDS and _RETRYABLE in peek):
                alt = _peek(alt)
            units = _literal_prefix(alt)
            trie.add(units, alt[len("".join(units)):], len(info) - 1, tag)
    owners: list[int] = []
    regex = re.compile(_BOUNDARY + _char_filter(trie) + trie.emit(owners))
    start = re.compile(" (?:" + "|".join(f"{alt}()" for alt, _ in anchored) + ")") if anchored else None
    if regex.groups != len(owners) or (start is not None and start.groups != len(anchored)):
        raise ValueError("rule patterns must not contain capturing groups; use (?:...)")
    marks = tuple(info[i] for i in owners)
    start_marks = tuple(info[i] for _, i in anchored)
    return regex, start, marks + start_marks


_TRIGGER_RULE = Rule("hint.trigger", "hint", "|".join(re.escape(w) for w in HINT_TRIGGERS),
                     "fsm.core.hints.HINT_TRIGGERS: where retry hints start")
_STATUS_IDS = frozenset(rule.id for rule in STATUS_RULES)
_CONDITION_IDS = frozenset(rule.id for rule in PERMANENT_RULES)
"""Permanent conditions (step 4): they outrank every status and family, in any source."""
_TAGGED = ([(_OVERFLOW, r) for r in OVERFLOW_RULES] + [(_PERMANENT, r) for r in PERMANENT_RULES]
           + [(_PERMANENT if r.id.startswith("fatal.") else _RETRYABLE, r) for r in STATUS_RULES]
           + [(_RETRYABLE, r) for r in RETRYABLE_RULES + USAGE_LIMIT_RULES] + [(_HINT, _TRIGGER_RULE)])
_USAGE_IDS = frozenset(rule.id for rule in USAGE_LIMIT_RULES)
# A quota's time window (per minute, per day…, also inside quota ids such as
# "GenerateRequestsPerMinutePerProjectPerModel"): "exceeded your current quota" next to one is a
# window that refills, not billing exhaustion (Gemini's free tier uses the billing wording).
# A generic RESOURCE_EXHAUSTED names no window.
_QUOTA_WINDOW_RE = re.compile(r"per[ _-]?(?:second|minute|min|hour|day)(?![a-z])|per[ _-]?(?:minute|hour|day)"
                              r"|[rt]p[smhd](?![a-z0-9_])")
_INWORD_USAGE = ("perday", "perhour")  # retryable.inword_quota_window
# A message that names a 429 (or throttling) is rate limiting, never overflow (docs/policy.md §2) ...
_GUARD_IDS = frozenset({"retryable.status_429", "retryable.too_many_requests", "retryable.throttled"})
# ... except a single request larger than the limit itself (docs/policy.md §2 v2).
_BEATS_429 = frozenset({"overflow.request_above_limit"})
# Substrings without which no guard rule can match (checked by the tests): `in` is far cheaper
# than a regex scan, and most overflow messages have none of them.
_GUARD_NEEDLES = ("429", "too many", "too_many", "toomany", "throttl")

# The questions a scan answers, as sets of rules ("categories").
_O, _PS, _PY, _R, _U, _G, _ST = ("overflow", "strict_permanent", "yielding_permanent", "retryable",
                                 "usage", "guard", "status")


def _category_rules(category: str) -> list[tuple[int, Rule]]:
    keep = {
        _O: lambda tag, rule: tag == _OVERFLOW,
        _PS: lambda tag, rule: (tag == _PERMANENT and rule.id not in _YIELDS_TO_HINT
                                and rule.id not in _STATUS_IDS),
        _PY: lambda tag, rule: tag == _PERMANENT and rule.id in _YIELDS_TO_HINT,
        _R: lambda tag, rule: tag == _RETRYABLE,
        _U: lambda tag, rule: tag == _RETRYABLE and rule.id in _USAGE_IDS,
        _G: lambda tag, rule: tag == _RETRYABLE and rule.id in _GUARD_IDS,
        _ST: lambda tag, rule: rule.id in _STATUS_IDS,
    }[category]
    return [(tag, rule) for tag, rule in _TAGGED if keep(tag, rule)]


class _Matcher:
    """A compiled set of rules: ``regex`` (``marks[m.lastindex - 1]`` → ``(tag, rule,
    starts_with_a_hint_trigger)``) and the ``^``-anchored alternatives (:meth:`at_start`)."""

    __slots__ = ("regex", "start", "marks", "start_marks")

    def __init__(self, entries: list[tuple[int, Rule]], peek: frozenset[int]) -> None:
        self.regex, self.start, marks = _compile(entries, peek)
        self.marks = marks[:self.regex.groups]
        self.start_marks = marks[self.regex.groups:]

    def at_start(self, t: str) -> tuple[int, Rule, bool] | None:
        """The ``^``-anchored rule matching at the start of ``t`` (padded with a space)."""
        m = None if self.start is None else self.start.match(t)
        return None if m is None else self.start_marks[m.lastindex - 1]  # type: ignore[operator]

    def start_chars(self) -> str:
        """The characters an anchored alternative can start with ("" when unknown)."""
        chars = set()
        for _, rule, _ in self.start_marks:
            for alt in _alternatives(rule.pattern):
                if alt.startswith("^"):
                    units = _literal_prefix(alt[1:])
                    if not units:  # pragma: no cover - anchored table rules start with a digit
                        return ""
                    chars.add(units[0][-1])
        return "".join(sorted(chars))


_SUBSETS: dict[frozenset[str], _Matcher] = {}


def _subset(categories: frozenset[str]) -> _Matcher:
    """The matcher for a union of categories, compiled on first use (only texts with very many
    matches, or a 429 next to an overflow, need them)."""
    matcher = _SUBSETS.get(categories)
    if matcher is None:
        entries = [entry for category in sorted(categories) for entry in _category_rules(category)]
        matcher = _SUBSETS[categories] = _Matcher(entries, frozenset({_RETRYABLE}))
    return matcher


_ALL = _Matcher(list(_TAGGED), frozenset({_RETRYABLE, _HINT}))
_ALL_FINDITER = _ALL.regex.finditer
# per marker group: (tag, rule, starts with a hint trigger, is a usage-limit rule, stands down
# for a hint, is a status marker)
_ALL_MARKS = tuple((tag, rule, trigger, rule.id in _USAGE_IDS, rule.id in _YIELDS_TO_HINT,
                    rule.id in _STATUS_IDS)
                   for tag, rule, trigger in _ALL.marks)
_ALL_START_CHARS = _ALL.start_chars()
_MAX_MATCHES = 48  # more (adversarial repetitions): one search per open question instead
_STATUS_SCAN_LIMIT = 64  # status markers read one by one before jumping to the text's tail
_STATUS_TAIL = 8192  # characters of a long text's tail where its innermost status is looked for


class _Anywhere:
    """Rules looked for anywhere (no word start): those marked ``anywhere`` and the
    alternatives written in scripts without spaces (Chinese…), as one plain alternation.
    A plain alternation tries every alternative at every position, so it runs only when one
    of the alternatives' literal prefixes (``needles``) occurs in the text (``in`` is a C
    substring search)."""

    __slots__ = ("rules", "regex", "needles")

    def __init__(self, rules: tuple[Rule, ...]) -> None:
        kept, parts, needles = [], [], set()
        for rule in rules:
            alts = [a for a in _alternatives(rule.pattern) if rule.anywhere or a[:1] > "\x7f"]
            if alts:
                kept.append(rule)
                parts.append("(?:" + "|".join(alts) + ")()")
                for alt in alts:
                    units = _literal_prefix(alt)
                    if not units:  # pragma: no cover - checked by the tests
                        raise ValueError(f"{rule.id}: an anywhere alternative must start with a literal")
                    needles.add(units[0][-1] if alt[:1] > "\x7f" else "".join(u[-1] for u in units))
        self.rules = tuple(kept)
        self.regex = re.compile("|".join(parts))
        self.needles = tuple(sorted(needles))

    def search(self, t: str) -> Rule | None:
        for needle in self.needles:
            if needle in t:
                m = self.regex.search(t)
                return None if m is None else self.rules[m.lastindex - 1]  # type: ignore[operator]
        return None


_ANYWHERE_RETRYABLE = _Anywhere(RETRYABLE_RULES + INWORD_RULES)
_ANYWHERE_PERMANENT = _Anywhere(PERMANENT_RULES)

_NOT_ERROR = Classification("none", "stop_reason.not_error")
_NO_MESSAGE = Classification("fatal", "error.no_message")
_SILENT_OVERFLOW = Classification("context_overflow", "overflow.silent_usage")
_UNMATCHED = Classification("fatal", "fatal.unmatched")
_RESULT: dict[tuple[str, bool], Classification] = {}
for _tag, _rule in _TAGGED[:-1] + [(_RETRYABLE, r) for r in INWORD_RULES]:
    _RESULT[_rule.id, False] = Classification(  # type: ignore[arg-type]
        ("context_overflow", "fatal", "retryable")[_tag], _rule.id)
    _RESULT[_rule.id, True] = Classification("retryable", _rule.id, True)


def _names_a_quota_window(t: str) -> bool:
    return (("per" in t or "rp" in t or "tp" in t)  # C substring checks first
            and _QUOTA_WINDOW_RE.search(t) is not None)


def _names_a_429(t: str) -> bool:
    for needle in _GUARD_NEEDLES:
        if needle in t:
            return _subset(frozenset({_G})).regex.search(t) is not None
    return False


def classify(stop_reason: str, error_message: str | None, usage: Usage | None = None,
             context_window: int = 0, *, now_ms: float | None = None) -> Classification:
    """Classify how a turn ended from its text alone (``docs/policy.md §2``; the order is in
    the module docstring). For a message that also carries structured facts (HTTP status,
    error type/code, headers) use :func:`classify_facts` or :func:`classify_message`.

    ``stop_reason``: ``"stop"``, ``"length"``, ``"toolUse"``, ``"error"`` or ``"aborted"``
    (anything but ``"error"`` gives ``none``). ``error_message``: the provider's error text as
    the SDK reported it, or ``None``; read whole, before any clipping. ``usage``: token counts
    of the failed message (for silent overflow). ``context_window``: the model's context window
    in tokens; 0 (or less) disables the silent-overflow check. ``now_ms``: wall clock in epoch
    ms for absolute retry hints (default: now).

    Returns a :class:`Classification`; never raises for a ``str`` message of any size (linear
    time: a few µs for a provider's message, tens of ms for a megabyte).
    """
    if stop_reason != "error":
        return _NOT_ERROR
    if not error_message or error_message.isspace():
        return _NO_MESSAGE
    t = _normalize(error_message)  # " " + the normal form
    silent = (usage is not None and context_window > 0
              and usage.input + usage.cache_read > context_window)

    permanent = retryable = status = None
    usage_limit = yielding = False
    triggers: list[int] | None = []
    if t[1:2] in _ALL_START_CHARS:
        start = _ALL.at_start(t)
        if start is not None:
            if start[0] == _OVERFLOW:
                return _overflow(t, start[1], silent, now_ms)
            if start[1].id in _STATUS_IDS:
                status = start[1]
            else:  # pragma: no cover - the anchored permanent rules are status markers
                permanent = start[1]
    count = 0
    for m in _ALL_FINDITER(t):
        tag, rule, trigger, is_usage, yields, is_status = _ALL_MARKS[m.lastindex - 1]  # type: ignore[operator]
        if tag == _RETRYABLE:
            if retryable is None:
                retryable = rule
            if is_usage:
                usage_limit = True
            elif is_status:
                status = rule
        elif tag == _OVERFLOW:
            return _overflow(t, rule, silent, now_ms, m.start() + 1, permanent, retryable,
                             usage_limit, status)
        elif is_status:
            status = rule
        elif tag == _PERMANENT and (permanent is None or (yielding and not yields)):
            permanent, yielding = rule, yields
        count += 1
        if count > _MAX_MATCHES:
            return _continue(t, m.start() + 1, silent, permanent, retryable, usage_limit, now_ms,
                             status=status)
        if trigger:
            triggers.append(m.start() + 1)  # type: ignore[union-attr]
    if silent:
        return _overflow(t, None, silent, now_ms, len(t), permanent, retryable, usage_limit, status)
    if (permanent is None and retryable is not None and not triggers and t.isascii()
            and (status is None or status.id[0] == "r")):
        # the common case, without a hint
        return _RESULT[retryable.id, usage_limit or _INWORD_USAGE[0] in t or _INWORD_USAGE[1] in t]
    if not t.isascii():
        triggers = None  # trigger words inside such scripts have no word start: search all
    return _decide(t, permanent, retryable, usage_limit, triggers, now_ms, status)


def _overflow(t: str, rule: Rule | None, silent: bool, now_ms: float | None, pos: int = 1,
              permanent: Rule | None = None, retryable: Rule | None = None,
              usage_limit: bool = False, status: Rule | None = None) -> Classification:
    """Step 3 found an overflow rule (``rule``, at ``pos``) or a silent overflow: it decides
    unless the message names a 429 (and the rule is not one of a request larger than the limit
    itself); then steps 4-6 go on from ``pos``."""
    if (rule is not None and rule.id in _BEATS_429) or not _names_a_429(t):
        return _SILENT_OVERFLOW if rule is None else _RESULT[rule.id, False]
    if rule is None:  # a silent overflow voided: the text was scanned to the end already
        return _continue(t, len(t), False, permanent, retryable, usage_limit, now_ms, status=status)
    return _continue(t, pos, False, permanent, retryable, usage_limit, now_ms,
                     overflow_done=True, status=status)


def _continue(t: str, pos: int, silent: bool, permanent: Rule | None, retryable: Rule | None,
              usage_limit: bool, now_ms: float | None, *, overflow_done: bool = False,
              status: Rule | None = None) -> Classification:
    """The rest of :func:`classify` from ``t[pos:]``, for texts with very many matches (or an
    overflow voided by a 429): one search per open question, each resuming where the last one
    stopped and each answering a question, so the text is still read about once; the
    innermost status marker is then looked for from ``pos`` (:func:`_last_status`)."""
    start_pos = pos
    open_ = set() if overflow_done else {_O}
    if permanent is None or permanent.id in _YIELDS_TO_HINT:
        open_.add(_PS)
        if permanent is None:
            open_.add(_PY)
        if retryable is None:
            open_.add(_R)
        if not usage_limit:
            open_.add(_U)
    while open_:
        matcher = _subset(frozenset(open_))
        m = matcher.regex.search(t, pos)
        if m is None:
            break
        tag, rule, _ = matcher.marks[m.lastindex - 1]  # type: ignore[operator]
        pos = m.start() + 1
        if tag == _OVERFLOW:
            if rule.id in _BEATS_429 or not _names_a_429(t):
                return _RESULT[rule.id, False]
            open_.discard(_O)
            silent = False
        elif tag == _PERMANENT:
            if rule.id in _YIELDS_TO_HINT:
                permanent = permanent or rule
                open_.discard(_PY)
            else:
                permanent = rule
                open_ -= {_PS, _PY, _R, _U}
        else:
            retryable = retryable or rule
            open_.discard(_R)
            if rule.id in _USAGE_IDS:
                usage_limit = True
                open_.discard(_U)
    if silent and not _names_a_429(t):
        return _SILENT_OVERFLOW
    status = _last_status(t, start_pos, status)
    return _decide(t, permanent, retryable, usage_limit, None, now_ms, status)


def _last_status(t: str, pos: int, status: Rule | None) -> Rule | None:
    """The innermost (last) status marker after ``pos``, else ``status``, for texts with very
    many matches: only their last :data:`_STATUS_TAIL` characters are read again (an error
    text kept anywhere is clipped to 8 KB, ``docs/policy.md §8b``), so the work stays bounded."""
    matcher = _subset(frozenset({_ST}))
    marks = matcher.marks
    for m in matcher.regex.finditer(t, max(pos, len(t) - _STATUS_TAIL)):
        status = marks[m.lastindex - 1][1]  # type: ignore[operator]
    return status


def _decide(t: str, permanent: Rule | None, retryable: Rule | None, usage_limit: bool,
            triggers: list[int] | None, now_ms: float | None, status: Rule | None = None
            ) -> Classification:
    """Steps 4-6 once no overflow applies. ``status``: the innermost status marker;
    ``triggers``: hint trigger positions, or ``None`` to look for them in the whole text."""
    if (permanent is None or permanent.id in _YIELDS_TO_HINT) and not t.isascii():
        permanent = _ANYWHERE_PERMANENT.search(t) or permanent
    hint = None
    if permanent is not None and permanent.id not in _YIELDS_TO_HINT:
        return _RESULT[permanent.id, False]
    if status is not None and status.id[0] == "f":
        return _RESULT[status.id, False]
    if retryable is None:
        retryable = _ANYWHERE_RETRYABLE.search(t)
        if retryable is not None:
            triggers = None
    if permanent is not None:  # it stands down for a retry hint or a quota window
        hint = parse_normalized_hint_ms(t, now_ms=now_ms)
        if retryable is None or (hint is None and not _names_a_quota_window(t)):
            return _RESULT[permanent.id, False]
    if retryable is None:
        return _UNMATCHED
    if not usage_limit and (_INWORD_USAGE[0] in t or _INWORD_USAGE[1] in t):
        usage_limit = True
    if hint is None:
        if triggers is None:
            hint = parse_normalized_hint_ms(t, now_ms=now_ms)
        elif triggers:
            hint = parse_hint_at(t, triggers, now_ms=now_ms)
        if hint is None:
            return _RESULT[retryable.id, usage_limit]
    return Classification("retryable", retryable.id, usage_limit, hint)


# --------------------------------------------------------------------------------------------
# Structured facts first (docs/policy.md §2 "Structured facts first", precedence §8b.8):
# overflow markers (any source) > permanent-condition markers (any source; x-should-retry: false
# among them) > x-should-retry: true >
# the innermost structured status/type (the body's code/type, then the innermost status named
# in the text) > the outer HTTP status > the text families.

_ERROR_CODE_RULES: tuple[tuple[str, str, str, str], ...] = (
    # (code or type, kind, family, source)
    ("context_length_exceeded", "context_overflow", "context_overflow", "OpenAI error.code"),
    ("model_context_window_exceeded", "context_overflow", "context_overflow", "z.ai, Codex"),
    ("context_window_exceeded", "context_overflow", "context_overflow", "Codex, routers"),
    ("request_too_large", "context_overflow", "request_size", "Anthropic 413 error.type"),
    ("string_above_max_length", "context_overflow", "request_size", "OpenAI error.code"),
    ("prompt_too_long", "context_overflow", "context_overflow", "routers"),
    ("max_prompt_tokens_exceeded", "context_overflow", "context_overflow", "GitHub Copilot"),
    ("model_max_prompt_tokens_exceeded", "context_overflow", "context_overflow", "GitHub Copilot"),
    ("exceed_context_size_error", "context_overflow", "context_overflow", "llama.cpp error.type"),
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
    ("serviceunavailableexception", "retryable", "server_5xx", "Bedrock ServiceUnavailableException"),
    ("internalserverexception", "retryable", "server_5xx", "Bedrock InternalServerException"),
    ("modelnotreadyexception", "retryable", "overloaded", "Bedrock ModelNotReadyException"),
    ("modeltimeoutexception", "retryable", "network", "Bedrock ModelTimeoutException"),
    ("modelstreamerrorexception", "retryable", "network", "Bedrock ModelStreamErrorException"),
    ("accessdeniedexception", "fatal", "auth", "Bedrock AccessDeniedException"),
    ("usage_limit_reached", "usage_limit", "usage_limit", "Codex/ChatGPT plans"),
    ("usage_limit_exceeded", "usage_limit", "usage_limit", "subscription plans"),
    ("limit_reached", "usage_limit", "usage_limit", "subscription plans"),
    ("api_error", "retryable", "server_5xx", "Anthropic 500 error.type"),
    ("server_error", "retryable", "server_5xx", "OpenAI error.type (D3)"),
    ("internal_error", "retryable", "server_5xx", "Google status INTERNAL, routers"),
    ("internal_server_error", "retryable", "server_5xx", "routers"),
    ("service_unavailable", "retryable", "server_5xx", "OpenAI error.code"),
    ("unavailable", "retryable", "server_5xx", "Google status UNAVAILABLE"),
    ("bad_gateway", "retryable", "server_5xx", "gateways"),
    ("gateway_timeout", "retryable", "network", "gateways"),
    ("timeout", "retryable", "network", "OpenAI error.type"),
    ("timeout_error", "retryable", "network", "Anthropic 504 error.type"),
    ("request_timeout", "retryable", "network", "routers"),
    ("deadline_exceeded", "retryable", "network", "Google status DEADLINE_EXCEEDED"),
    ("authentication_error", "fatal", "auth", "Anthropic 401 error.type"),
    ("permission_error", "fatal", "auth", "Anthropic 403 error.type"),
    ("invalid_api_key", "fatal", "auth", "OpenAI 401 error.code"),
    ("permission_denied", "fatal", "auth", "Google status PERMISSION_DENIED"),
    ("unauthenticated", "fatal", "auth", "Google status UNAUTHENTICATED"),
    ("not_found_error", "fatal", "model_not_found", "Anthropic 404 error.type"),
    ("model_not_found", "fatal", "model_not_found", "OpenAI 404 error.code"),
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
_STATUS_VERDICT = {**{n: "retryable" for n in RETRYABLE_STATUSES}, **{n: "fatal" for n in FATAL_STATUSES},
                   402: "permanent", 413: "context_overflow"}
_RATE_FAMILIES = frozenset({"rate_limit", "usage_limit"})
_STATUS_DIGITS = re.compile(r"[1-5][0-9][0-9]")


def _family(rule_id: str) -> str:
    rule = _RULES_BY_ID.get(rule_id)
    return rule.family if rule is not None else ""


_RULES_BY_ID = {rule.id: rule for _, rule in _TAGGED[:-1]} | {rule.id: rule for rule in INWORD_RULES}


def _text_status(t: str) -> tuple[Rule, int | None] | None:
    """The innermost status marker of the normal form ``t`` (leading space) and its number."""
    rule = None
    start = _ALL.at_start(t) if t[1:2] in _ALL_START_CHARS else None
    if start is not None and start[1].id in _STATUS_IDS:
        rule = start[1]
    matcher = _subset(frozenset({_ST}))
    last = None
    count = 0
    for m in matcher.regex.finditer(t):
        last = m
        count += 1
        if count > _STATUS_SCAN_LIMIT:
            for m in matcher.regex.finditer(t, max(m.end(), len(t) - _STATUS_TAIL)):
                last = m
            break
    if last is not None:
        rule = matcher.marks[last.lastindex - 1][1]  # type: ignore[operator]
        digits = _STATUS_DIGITS.search(t, last.start(), last.end() + 4)
        return rule, int(digits.group()) if digits else None
    if rule is not None:
        digits = _STATUS_DIGITS.match(t, 1)
        return rule, int(digits.group()) if digits else None
    return None


def classify_facts(stop_reason: str, error_message: str | None, usage: Usage | None = None,
                   context_window: int = 0, *, status: int | None = None,
                   error_type: str | None = None, error_code: str | None = None,
                   headers: Mapping[str, str] | None = None,
                   now_ms: float | None = None) -> Classification:
    """Classify a turn's end from its structured facts first, then its text.

    ``status``: the HTTP status of the failed response; ``error_type`` / ``error_code``: the
    provider's error type and code (``"overloaded_error"``, ``"rate_limit_exceeded"``…, see
    :data:`ERROR_CODES`); ``headers``: the response headers with lower-case keys (hints from
    ``retry-after-ms``, ``retry-after``, ``x-ratelimit-reset*``, ``anthropic-ratelimit-*-reset``;
    the verdict of ``x-should-retry``). The other arguments are those of :func:`classify`.
    Without any fact this is :func:`classify`.

    Precedence (``docs/policy.md §2``, §8b.8): overflow markers of any source > permanent
    conditions of any source > ``x-should-retry`` > the body's typed code/type > the innermost
    status named in the text > the outer ``status`` > the text families. The rule id says which
    fact decided: ``structured.status_529``, ``structured.code_rate_limit_exceeded``,
    ``structured.type_overloaded_error``, ``structured.x_should_retry_false``, or a text rule id.
    A retryable result's hint comes from the headers (reset headers only for rate and usage
    limits, :func:`fsm.core.hints.header_hint`), else from the text.
    """
    if stop_reason != "error":
        return _NOT_ERROR
    if status is None and error_type is None and error_code is None and not headers:
        return classify(stop_reason, error_message, usage, context_window, now_ms=now_ms)
    text = error_message if error_message and not error_message.isspace() else ""
    tr = classify(stop_reason, text or None, usage, context_window, now_ms=now_ms)
    if tr.rule == "error.no_message":
        tr = _UNMATCHED
    codes = [(f"code_{c}", c) for c in (error_code,) if isinstance(c, str) and c]
    codes += [(f"type_{c}", c) for c in (error_type,) if isinstance(c, str) and c]
    typed = [(name.lower(), ERROR_CODES.get(value.lower()), value) for name, value in codes]
    outer = _STATUS_VERDICT.get(status) if status is not None else None

    # 1. overflow, any source (a 429 voids the text's unless the request itself is too large)
    for name, verdict, _ in typed:
        if verdict is not None and verdict[0] == "context_overflow":
            return Classification("context_overflow", f"structured.{name}")
    if outer == "context_overflow":
        return Classification("context_overflow", f"structured.status_{status}")
    if tr.kind == "context_overflow":
        if status != 429 or tr.rule in _BEATS_429:
            return tr
        tr = classify(stop_reason, "429 " + text, now_ms=now_ms)  # a 429 is rate limiting
    # 2. permanent conditions, any source
    for name, verdict, _ in typed:
        if verdict is not None and verdict[0] == "permanent":
            return Classification("fatal", f"structured.{name}")
    if outer == "permanent":
        return Classification("fatal", f"structured.status_{status}")
    verdict_header = should_retry_header(headers)
    if verdict_header is False:  # the server's own verdict: not worth retrying
        return Classification("fatal", "structured.x_should_retry_false")
    if tr.kind == "fatal" and tr.rule in _CONDITION_IDS:
        return tr
    # 3. the server's own verdict: worth retrying
    if verdict_header is True:
        return _retryable(f"structured.x_should_retry_true", status == 429, tr, text, headers, now_ms)
    # 4. the body's typed code/type (a numeric code is an inner status)
    for name, verdict, value in typed:
        if verdict is None and name.startswith("code_") and _STATUS_DIGITS.fullmatch(value):
            inner = _STATUS_VERDICT.get(int(value))
            if inner in ("retryable", "fatal"):
                verdict = (inner, "rate_limit" if value == "429" else "", "")
                name = f"inner_status_{value}"
        if verdict is None:
            continue
        kind, family, _ = verdict
        if kind == "fatal":
            return Classification("fatal", f"structured.{name}")
        return _retryable(f"structured.{name}", family in _RATE_FAMILIES, tr, text, headers, now_ms,
                          usage_limit=kind == "usage_limit")
    # 5. the innermost status the text names (inside a wrapper), 6. the outer status
    found = _text_status(_normalize(text)) if text else None
    if found is not None:
        rule, number = found
        rule_id = f"structured.status_{status}" if number is not None and number == status else rule.id
        if rule.id[0] == "f":
            return Classification("fatal", rule_id)
        return _retryable(rule_id, rule.family == "rate_limit", tr, text, headers, now_ms)
    # a usage limit the body states is the provider's own verdict on the account, inner to a
    # wrapper's status (LiteLLM maps Anthropic's usage-limit 400 to BadRequestError)
    if tr.kind == "retryable" and tr.usage_limit:
        return _retryable(tr.rule, True, tr, text, headers, now_ms)
    if outer == "fatal":
        return Classification("fatal", f"structured.status_{status}")
    if outer == "retryable":
        return _retryable(f"structured.status_{status}", status == 429, tr, text, headers, now_ms)
    # 7. the text families
    if tr.kind == "retryable":
        return _retryable(tr.rule, _family(tr.rule) in _RATE_FAMILIES, tr, text, headers, now_ms)
    return tr


def _retryable(rule_id: str, rate_limited: bool, tr: Classification, text: str,
               headers: Mapping[str, str] | None, now_ms: float | None, *,
               usage_limit: bool = False) -> Classification:
    """A retryable verdict with the usage-limit flag of the facts or the text, and the hint of
    the headers, else of the text."""
    usage_limit = usage_limit or (tr.kind == "retryable" and tr.usage_limit)
    rate_limited = rate_limited or usage_limit or (tr.kind == "retryable" and _family(tr.rule) in _RATE_FAMILIES)
    found = header_hint(headers, rate_limited=rate_limited, now_ms=now_ms)
    if found is not None:
        hint: int | None = found.ms
    elif tr.kind == "retryable":
        hint = tr.retry_hint_ms
    else:
        hint = parse_retry_hint_ms(text, now_ms=now_ms) if text else None
    return Classification("retryable", rule_id, usage_limit, hint)


def classify_message(message: AssistantMessage, context_window: int = 0, *,
                     now_ms: float | None = None) -> Classification:
    """:func:`classify_facts` applied to an assistant message: its stop reason, error message,
    usage and structured facts (``status``, ``error_type``, ``error_code``, ``headers``).

    A server error whose text says "overloaded" (OpenAI's "503 … overloaded") has the family
    ``overloaded`` (docs/policy.md §13.6)."""
    cls = _classify_message(message, context_window, now_ms=now_ms)
    if (cls.family == "server_error" and message.error_message
            and "overload" in message.error_message.lower()):
        return Classification(cls.kind, cls.rule, cls.usage_limit, cls.retry_hint_ms, "overloaded")
    return cls


def _classify_message(message: AssistantMessage, context_window: int = 0, *,
                      now_ms: float | None = None) -> Classification:
    return classify_facts(message.stop_reason, message.error_message, message.usage, context_window,
                          status=message.status, error_type=message.error_type,
                          error_code=message.error_code, headers=message.headers, now_ms=now_ms)
