"""Search QA environment in the BrowseComp-Plus layout (TRACE's setting): BM25 `search` and `open` over a fixed corpus.

The package, one job per module; each imports only modules listed above it:
  data.py        the records: `Document`, `Hop`, `SearchTask`; `snippet` (the text cut of results and titles).
  index.py       `SearchIndex`: BM25 retrieval over a corpus (`bm25s`, optional PyStemmer stemming).
  browsecomp.py  `load_corpus`, `load_queries`: BrowseComp-Plus (or the same layout) from JSONL or a datasets folder.
  world.py       `make_fictional_corpus`: invented facts and multi-hop questions over them.
  env.py         `SearchEnv` (one rollout; the tools, the reward and the module notes on both), answer matching,
                 prompts, demonstrations, the teacher's text, task lists, and `env_spec` with `CONFIG_DEFAULTS` (what
                 the `ENVS["search"]` row calls).

Every public name (and the private ones tests and benchmarks read) is re-exported here, so
`from jaxcredit.envs.search import X` works as before the split. To monkeypatch a name, patch it in the module that
looks it up (e.g. `jaxcredit.envs.search.env`), not here.
"""

# The private names imported "as" themselves are re-exported for old callers; they are not in __all__.
from jaxcredit.envs.search.browsecomp import derive_title, load_corpus, load_queries
from jaxcredit.envs.search.data import Document, Hop, SearchTask, snippet
from jaxcredit.envs.search.env import (
  CONFIG_DEFAULTS,
  EVAL_SIZE,
  MAX_OUTPUT_CHARS,
  MAX_QUERY_CHARS,
  MAX_TOOL_CALLS,
  NUM_GENERATED,
  OPEN_DESCRIPTION,
  PRIVILEGED_CHARS,
  SEARCH_DESCRIPTION,
  SEARCH_ONLY_DESCRIPTION,
  SEARCH_ONLY_PROMPT,
  SNIPPET_CHARS,
  SYSTEM_PROMPT,
  SearchEnv,
  StepResult,
  answer_matches,
  demonstration,
  env_spec,
  gold_answer_text,
  initial_messages,
  make_tasks,
  metrics,
  normalize_answer,
  privileged_info,
  split_tasks,
  tool_schemas,
)
from jaxcredit.envs.search.index import TOP_K, SearchIndex
from jaxcredit.envs.search.world import _COMPANY_KINDS as _COMPANY_KINDS  # read by tests/envs/test_env_search.py
from jaxcredit.envs.search.world import _MONTHS as _MONTHS  # read by tests/envs/test_env_search.py
from jaxcredit.envs.search.world import _TEMPLATE_WORDS as _TEMPLATE_WORDS  # read by benchmarks/testbed_compare.py
from jaxcredit.envs.search.world import _WORK_KINDS as _WORK_KINDS  # read by tests/envs/test_env_search.py
from jaxcredit.envs.search.world import MAX_HOPS, make_fictional_corpus
from jaxcredit.envs.search.world import _Names as _Names  # read by benchmarks/testbed_compare.py

__all__ = (
  "CONFIG_DEFAULTS",
  "Document",
  "EVAL_SIZE",
  "Hop",
  "MAX_HOPS",
  "MAX_OUTPUT_CHARS",
  "MAX_QUERY_CHARS",
  "MAX_TOOL_CALLS",
  "NUM_GENERATED",
  "OPEN_DESCRIPTION",
  "PRIVILEGED_CHARS",
  "SEARCH_DESCRIPTION",
  "SEARCH_ONLY_DESCRIPTION",
  "SEARCH_ONLY_PROMPT",
  "SNIPPET_CHARS",
  "SYSTEM_PROMPT",
  "SearchEnv",
  "SearchIndex",
  "SearchTask",
  "StepResult",
  "TOP_K",
  "answer_matches",
  "demonstration",
  "derive_title",
  "env_spec",
  "gold_answer_text",
  "initial_messages",
  "load_corpus",
  "load_queries",
  "make_fictional_corpus",
  "make_tasks",
  "metrics",
  "normalize_answer",
  "privileged_info",
  "snippet",
  "split_tasks",
  "tool_schemas",
)
