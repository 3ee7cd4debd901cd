"""TRACE on search QA (its BrowseComp-Plus setting): the frozen reference scores the gold answer at every tool-call
boundary, so a search that finds the evidence raises the state value and earns its own credit. By default the corpus
is generated fictional facts (answers need 1 to 4 searches, with distractors; nothing a model already knows).

Sized for one host with SmolLM2-135M. With BrowseComp-Plus downloaded and decrypted (docs/environments.md):

  jaxcredit train --config configs/trace_search.py
  jaxcredit train --config configs/trace_search.py --config.env.search.corpus=bcp/corpus.jsonl \\
      --config.env.search.queries=bcp/queries.jsonl --config.env.num_train_tasks=700
"""

from jaxcredit.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/trace_search"
  c.credit.method = "trace"
  c.env.name = "search"
  c.env.num_train_tasks = 1000  # the generated corpus's train questions
  c.env.search.max_tool_calls = 8  # a search and an open per hop
  c.env.search.max_output_chars = 600  # an opened document is cut here (with a marker)
  c.env.search.top_k = 3
  c.sampling.max_new_tokens = 64
  c.sampling.max_len = 2048
  c.teacher.max_len = 2048
  c.train.length_bucket = 256
  c.eval.num_tasks = 32
  c.eval.batch_size = 16
  return c
