"""The generated fictional corpus: `make_fictional_corpus`.

Invented people, companies, towns, schools and built works, so no model knows the facts. Questions are chains of 1 to
4 look-ups ("the birthplace of the founder of the company that built X"); every hop is found by searching the current
entity's name, and similar-named entities with similar facts act as distractors. Held-out questions come from a
separate part of the world (no entity of an eval chain is in a train chain).
"""

from __future__ import annotations

import dataclasses
import random
import re
from typing import Sequence

from jaxcredit.envs.search.data import Document, Hop, SearchTask

MAX_HOPS = 4  # the longest generated chain (searches needed)

_ONSETS = (
  "b",
  "br",
  "d",
  "dr",
  "f",
  "g",
  "gr",
  "h",
  "k",
  "kr",
  "l",
  "m",
  "n",
  "p",
  "r",
  "s",
  "sk",
  "st",
  "t",
  "th",
  "tr",
  "v",
  "w",
  "z",
)
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ei", "ia", "ou")
_CODAS = ("", "", "", "l", "n", "r", "s", "th", "rn", "nd", "sk", "m", "x", "rd", "lt")
_WORK_KINDS = (
  "Bridge",
  "Lighthouse",
  "Observatory",
  "Canal",
  "Tower",
  "Viaduct",
  "Dam",
  "Clocktower",
  "Library",
  "Aqueduct",
  "Theatre",
  "Mill",
)
_COMPANY_KINDS = (
  "Holdings",
  "Works",
  "Foundry",
  "Industries",
  "Shipping",
  "Instruments",
  "Mills",
  "Brothers",
  "Company",
  "Ironworks",
  "Textiles",
  "Glassworks",
)
_SCHOOL_KINDS = ("Academy", "College", "Institute", "Conservatory", "Seminary")
_SCHOOL_FIELDS = (
  "Surveying",
  "Navigation",
  "Botany",
  "Music",
  "Engineering",
  "Medicine",
  "Law",
  "Astronomy",
  "Mining",
  "Drawing",
)
_PROFESSIONS = (
  "cartographer",
  "glassblower",
  "surveyor",
  "engineer",
  "botanist",
  "clockmaker",
  "shipwright",
  "stonemason",
  "astronomer",
  "printer",
  "architect",
  "composer",
)
_INDUSTRIES = (
  "glassware",
  "rope",
  "clocks",
  "ship engines",
  "lamps",
  "paper",
  "telescopes",
  "copper wire",
  "railway carriages",
  "bells",
  "pianos",
  "barometers",
)
_MATERIALS = ("stone", "brick", "granite", "timber", "iron", "limestone", "sandstone", "slate")
_ADJECTIVES = ("narrow", "painted", "crooked", "vaulted", "weathered", "copper", "gilded", "quiet", "tall", "plain")
_FEATURES = ("arches", "windows", "stairways", "gates", "clock faces", "balconies", "galleries", "courtyards")
_TOWN_KINDS = ("market town", "harbour town", "hill town", "river town", "mining town", "cathedral city")
_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_TOPICS = ("tides", "mosses", "comets", "river levels", "bird calls", "old maps", "weather", "folk songs")
_MONTHS = (
  "January",
  "February",
  "March",
  "April",
  "May",
  "June",
  "July",
  "August",
  "September",
  "October",
  "November",
  "December",
)

_RELATIONS = {  # kind -> relation -> target kind (every relation is a function: one target)
  "work": {"builder": "company", "location": "city", "designer": "person"},
  "company": {"founder": "person", "hq": "city"},
  "person": {"birthplace": "city", "school": "school"},
  "city": {"mayor": "person"},
  "school": {"city": "city", "founder": "person"},
}
_ATTRIBUTES = {
  "work": ("completed",),
  "company": ("founded", "industry"),
  "person": ("birth_date", "profession"),
  "city": ("river", "founded"),
  "school": ("founded",),
}
_FACT = {  # the sentence in the subject's document; {s} subject, {o} object, {v} attribute value
  ("work", "builder"): "{S} was built by {o}.",
  ("work", "location"): "{S} stands in {o}.",
  ("work", "designer"): "{S} was designed by {o}.",
  ("work", "completed"): "Construction of {s} was completed in {v}.",
  ("company", "founder"): "{S} was founded by {o}.",
  ("company", "hq"): "{S} has its headquarters in {o}.",
  ("company", "founded"): "{S} was established in {v}.",
  ("company", "industry"): "{S} produces {v}.",
  ("person", "birthplace"): "{S} was born in {o}.",
  ("person", "school"): "{S} studied at {o}.",
  ("person", "birth_date"): "{S} was born on {v}.",
  ("person", "profession"): "{S} worked as a {v}.",
  ("city", "mayor"): "The first mayor of {s} was {o}.",
  ("city", "river"): "{S} lies on the river {v}.",
  ("city", "founded"): "{S} was founded in {v}.",
  ("school", "city"): "{S} is located in {o}.",
  ("school", "founder"): "{S} was founded by {o}.",
  ("school", "founded"): "{S} opened its doors in {v}.",
}
_MENTION = {  # the sentence in the object's document
  ("work", "builder"): "{O} built {s}.",
  ("work", "location"): "{O} is home to {s}.",
  ("work", "designer"): "{O} designed {s}.",
  ("company", "founder"): "{O} founded {s}.",
  ("company", "hq"): "{O} hosts the headquarters of {s}.",
  ("person", "birthplace"): "{O} is where {s} was born.",
  ("person", "school"): "Among the students of {o} was {s}.",
  ("city", "mayor"): "{O} served as a mayor of {s}.",
  ("school", "city"): "{O} is home to {s}.",
  ("school", "founder"): "{O} founded {s}.",
}
_NP = {  # the question's noun phrase for following a relation from {x}
  ("work", "builder"): "the company that built {x}",
  ("work", "location"): "the town where {x} stands",
  ("work", "designer"): "the person who designed {x}",
  ("company", "founder"): "the founder of {x}",
  ("company", "hq"): "the town where {x} has its headquarters",
  ("person", "birthplace"): "the birthplace of {x}",
  ("person", "school"): "the school where {x} studied",
  ("city", "mayor"): "the first mayor of {x}",
  ("school", "city"): "the town where {x} is located",
  ("school", "founder"): "the founder of {x}",
}
_ATTR_QUESTION = {
  ("work", "completed"): "In what year was {x} completed?",
  ("company", "founded"): "In what year was {x} founded?",
  ("company", "industry"): "What does {x} produce?",
  ("person", "birth_date"): "On what date was {x} born?",
  ("person", "profession"): "What did {x} work as?",
  ("city", "river"): "Which river flows through {x}?",
  ("city", "founded"): "In what year was {x} founded?",
  ("school", "founded"): "In what year did {x} open?",
}
_FILLERS = {
  "work": (
    "{S} is known for its {adj} {feature}.",
    "{S} was restored in {year}.",
    "Visitors to {s} often remark on its {adj} {feature}.",
  ),
  "company": (
    "{S} employed about {n} workers at its peak.",
    "{S} kept its ledgers in {adj} bound volumes.",
    "{S} opened a second workshop in {year}.",
  ),
  "person": (
    "{S} kept a notebook on {topic}.",
    "{S} travelled to the coast in {year}.",
    "About {n} letters by {s} survive.",
  ),
  "city": (
    "{S} holds a market every {weekday}.",
    "{S} has about {n} inhabitants.",
    "Many houses in {s} have {adj} {feature}.",
  ),
  "school": (
    "{S} enrols about {n} students.",
    "The library of {s} holds {n} volumes.",
    "{S} moved into a {material} building in {year}.",
  ),
}
_TEMPLATE_WORDS = frozenset(
  w.lower()
  for t in (*_FACT.values(), *_MENTION.values(), *_NP.values(), *_ATTR_QUESTION.values(), *sum(_FILLERS.values(), ()))
  for w in re.findall(r"[A-Za-z]+", t)
)


@dataclasses.dataclass
class _Entity:
  kind: str
  name: str  # as searched and answered, e.g. "Veltrana Bridge"
  world: int
  rel: dict[str, "_Entity"] = dataclasses.field(default_factory=dict)
  attr: dict[str, str] = dataclasses.field(default_factory=dict)
  alias: str = ""
  sibling_of: "_Entity | None" = None
  docid: str = ""
  text: str = ""
  facts: dict[str, str] = dataclasses.field(default_factory=dict)

  @property
  def display(self) -> str:
    return ("the " if self.kind in ("work", "school") else "") + self.name


class _Names:
  """Invented words, each used once across the whole corpus (so each name's words find its own documents)."""

  def __init__(self, rng: random.Random):
    self.rng = rng
    self.used: set[str] = set()

  def word(self) -> str:
    from bm25s.tokenization import STOPWORDS_EN

    for _ in range(10_000):
      w = "".join(
        self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS)
        for _ in range(self.rng.choice((2, 2, 3)))
      )
      if 4 <= len(w) <= 10 and w not in self.used and w not in STOPWORDS_EN and w not in _TEMPLATE_WORDS:
        self.used.add(w)
        return w.capitalize()
    raise RuntimeError("ran out of invented names")

  def variant(self, word: str) -> str:
    """A one-letter variant of `word` (a distractor town name), itself unused."""
    low = word.lower()
    for _ in range(1000):
      i = self.rng.randrange(1, len(low))
      w = low[:i] + self.rng.choice("aeioulnrst") + low[i + 1 :]
      if w != low and w not in self.used:
        self.used.add(w)
        return w.capitalize()
    return self.word()


def _new_entity(
  kind: str, world: int, names: _Names, rng: random.Random, first_names: Sequence[str], like: _Entity | None = None
) -> _Entity:
  """A new entity; with `like`, a distractor: a similar name (same stem, other kind word; same surname; a one-letter
  variant of a town)."""
  stem = like.name.split()[0] if like is not None and kind != "person" else names.word()
  if kind == "person":
    last = like.name.split()[-1] if like is not None else names.word()
    first = rng.choice([f for f in first_names if like is None or f != like.name.split()[0]])
    return _Entity(kind, f"{first} {last}", world, sibling_of=like)
  if kind == "city":
    return _Entity(kind, names.variant(like.name) if like is not None else stem, world, sibling_of=like)
  if kind == "work":
    kinds = [k for k in _WORK_KINDS if like is None or not like.name.endswith(k)]
    return _Entity(kind, f"{stem} {rng.choice(kinds)}", world, sibling_of=like)
  if kind == "company":
    kinds = [k for k in _COMPANY_KINDS if like is None or not like.name.endswith(k)]
    return _Entity(kind, f"{stem} {rng.choice(kinds)}", world, sibling_of=like)
  kinds = [k for k in _SCHOOL_KINDS if like is None or f" {k} " not in like.name]
  school_kind = rng.choice(kinds)
  return _Entity(
    kind, f"{stem} {school_kind} of {rng.choice(_SCHOOL_FIELDS)}", world, alias=f"{stem} {school_kind}", sibling_of=like
  )


def _world_sizes(num_questions: int) -> dict[str, int]:
  n = num_questions
  return {
    "work": max(8, n // 4),
    "company": max(6, n // 6),
    "person": max(12, n // 3),
    "city": max(6, n // 10),
    "school": max(4, n // 15),
  }


def _make_world(
  world: int, num_questions: int, names: _Names, rng: random.Random, first_names: Sequence[str], distractor_rate: float
) -> list[_Entity]:
  by_kind: dict[str, list[_Entity]] = {}
  for kind, count in _world_sizes(num_questions).items():
    ents = [_new_entity(kind, world, names, rng, first_names) for _ in range(count)]
    ents += [
      _new_entity(kind, world, names, rng, first_names, like=e) for e in list(ents) if rng.random() < distractor_rate
    ]
    by_kind[kind] = ents
  for kind, ents in by_kind.items():
    for e in ents:
      for rel, target_kind in _RELATIONS[kind].items():
        e.rel[rel] = rng.choice([t for t in by_kind[target_kind] if t is not e])
      e.attr = _attributes(kind, names, rng)
  for ents in by_kind.values():  # distractors share some facts with the entity they resemble, and nearly others
    for e in ents:
      if e.sibling_of is not None:
        rel = rng.choice(sorted(_RELATIONS[e.kind]))
        if e.sibling_of.rel[rel] is not e:
          e.rel[rel] = e.sibling_of.rel[rel]
        for key, value in e.sibling_of.attr.items():
          if key in ("completed", "founded"):
            e.attr[key] = str(int(value) + rng.choice((-3, -2, -1, 1, 2, 3)))
  return [e for ents in by_kind.values() for e in ents]


def _attributes(kind: str, names: _Names, rng: random.Random) -> dict[str, str]:
  if kind == "work":
    return {"completed": str(rng.randint(1780, 1960))}
  if kind == "company":
    return {"founded": str(rng.randint(1750, 1950)), "industry": rng.choice(_INDUSTRIES)}
  if kind == "person":
    month = rng.randrange(12)
    return {
      "birth_date": f"{rng.randint(1, 28)} {_MONTHS[month]} {rng.randint(1740, 1940)}",
      "profession": rng.choice(_PROFESSIONS),
    }
  if kind == "city":
    return {"river": names.word(), "founded": str(rng.randint(900, 1700))}
  return {"founded": str(rng.randint(1700, 1950))}


def _answer_aliases(kind: str, key: str, value: str) -> tuple[str, ...]:
  if key == "birth_date":
    day, month, year = value.split()
    return (f"{month} {day}, {year}", f"{year}-{_MONTHS.index(month) + 1:02d}-{int(day):02d}")
  if key == "river":
    return (f"River {value}", f"{value} River")
  return ()


def _cap(s: str) -> str:
  return s[:1].upper() + s[1:]


_A_BEFORE_VOWEL = re.compile(r"\b([Aa]) (?=[aeiouAEIOU])")


def _an(sentence: str) -> str:
  """Writes the article "a" as "an" before a vowel ("worked as an engineer")."""
  return _A_BEFORE_VOWEL.sub(lambda m: m.group(1) + "n ", sentence)


def _write_document(e: _Entity, mentions: list[tuple[_Entity, str]], rng: random.Random) -> None:
  """Sets `e.text` (an intro sentence, then its facts, up to two mentions by others and fillers, shuffled) and
  `e.facts` (relation or attribute -> its sentence)."""
  fill = {"S": _cap(e.display), "s": e.display}
  for rel, target in e.rel.items():
    e.facts[rel] = _an(_FACT[(e.kind, rel)].format(o=target.display, **fill))
  for key, value in e.attr.items():
    e.facts[key] = _an(_FACT[(e.kind, key)].format(v=value, **fill))
  intro = {
    "work": f"{_cap(e.display)} is a {rng.choice(_MATERIALS)} {e.name.split()[-1].lower()}.",
    "company": f"{e.name} is a trading company.",
    "person": f"{e.name} appears in the parish records.",
    "city": f"{e.name} is a {rng.choice(_TOWN_KINDS)}.",
    "school": f"{_cap(e.display)} is a school.",
  }[e.kind]
  body = list(e.facts.values())
  rng.shuffle(mentions)
  body += [_MENTION[(src.kind, rel)].format(O=_cap(e.display), o=e.display, s=src.display) for src, rel in mentions[:2]]
  for template in rng.sample(_FILLERS[e.kind], 2):
    body.append(
      template.format(
        adj=rng.choice(_ADJECTIVES),
        feature=rng.choice(_FEATURES),
        year=rng.randint(1800, 1990),
        n=rng.randint(12, 900) * 10,
        topic=rng.choice(_TOPICS),
        weekday=rng.choice(_WEEKDAYS),
        material=rng.choice(_MATERIALS),
        **fill,
      )
    )
  rng.shuffle(body)
  e.text = " ".join(_an(x) for x in [intro] + body)


def _sample_question(ents: list[_Entity], hops: int, rng: random.Random) -> tuple | None:
  """A random chain of `hops` documents: (entities read, relations followed, final relation or attribute)."""
  path = [rng.choice(ents)]
  rels: list[str] = []
  while len(path) < hops:
    options = [r for r in sorted(path[-1].rel) if path[-1].rel[r] not in path]
    if not options:
      return None
    rel = rng.choice(options)
    rels.append(rel)
    path.append(path[-1].rel[rel])
  last = path[-1]
  finals = [r for r in sorted(last.rel) if last.rel[r] not in path] + list(_ATTRIBUTES[last.kind])
  return path, rels, rng.choice(finals)


def make_fictional_corpus(
  seed: int,
  num_questions: int,
  *,
  num_eval: int = 0,
  min_hops: int = 1,
  max_hops: int = MAX_HOPS,
  distractor_rate: float = 0.3,
) -> tuple[list[Document], list[SearchTask]]:
  """A corpus of invented facts and multi-hop questions over it; the same arguments give the same result.

  The world has people, companies, towns, schools and built works (bridges, mills, ...), each with one document that
  states its relations (builder, founder, birthplace, ...) and attributes (years, dates, rivers, ...), mentions by a
  couple of others, and filler sentences. About `distractor_rate` of the entities have a look-alike (same stem with
  another kind word, same surname, a one-letter different town) whose facts partly coincide (shared relations, years
  a few apart). A question of h hops names one entity and follows h - 1 relations, e.g. "What is the birthplace of the
  founder of the company that built the Veltrana Bridge?" (3 hops): each hop is read from one document found by
  searching the current entity's name (its `Hop`), and the answer is in the last one. Hop counts cycle through
  min_hops..max_hops. The `num_eval` questions marked split="eval" come from a second, disjoint world in the same
  corpus, so no fact of an eval chain is learnt on the train questions.

  Args:
    seed: the generator's seed.
    num_questions: questions in all (train + eval).
    num_eval: how many of them are held out (split "eval"); the rest are split "train".
    min_hops, max_hops: the range of searches a question needs (1 <= min_hops <= max_hops <= 4).
    distractor_rate: the fraction of entities given a look-alike (0 to 1).

  Returns:
    (documents, tasks): eval tasks first; query_ids "fic-eval-N" and "fic-train-N"; docids "fNNNNN" in a shuffled
    order.

  Raises:
    ValueError: for arguments out of range.
  """
  if not 1 <= min_hops <= max_hops <= 4:
    raise ValueError(f"need 1 <= min_hops <= max_hops <= 4, got {min_hops}, {max_hops}")
  if not 0 <= num_eval <= num_questions or num_questions < 1:
    raise ValueError(f"need 0 <= num_eval <= num_questions and num_questions >= 1, got {num_eval}, {num_questions}")
  if not 0.0 <= distractor_rate <= 1.0:
    raise ValueError(f"distractor_rate must be in [0, 1], got {distractor_rate}")
  rng = random.Random(f"jaxcredit-search-fictional/{seed}")
  names = _Names(rng)
  first_names = [names.word() for _ in range(40)]
  counts = [("eval", num_eval), ("train", num_questions - num_eval)]
  worlds = [_make_world(w, n, names, rng, first_names, distractor_rate) if n else [] for w, (_, n) in enumerate(counts)]
  everyone = [e for ents in worlds for e in ents]
  mentions: dict[int, list[tuple[_Entity, str]]] = {id(e): [] for e in everyone}
  for e in everyone:
    for rel, target in e.rel.items():
      mentions[id(target)].append((e, rel))
  order = list(range(len(everyone)))
  rng.shuffle(order)
  for num, i in enumerate(order):
    everyone[i].docid = f"f{num:05d}"
  for e in everyone:
    _write_document(e, mentions[id(e)], rng)
  tasks: list[SearchTask] = []
  hop_cycle = list(range(min_hops, max_hops + 1))
  for (split, n), ents in zip(counts, worlds):
    seen: set[str] = set()
    made = 0
    for _ in range(200 * n + 1000):
      if made == n:
        break
      sample = _sample_question(ents, hop_cycle[made % len(hop_cycle)], rng)
      if sample is None:
        continue
      task = _question(f"fic-{split}-{made}", split, *sample)
      if task.query in seen:
        continue
      seen.add(task.query)
      tasks.append(task)
      made += 1
    if made < n:
      raise ValueError(f"only {made} distinct {split} questions found; asked for {n}")
  docs = sorted((Document(e.docid, e.name, e.text) for e in everyone), key=lambda d: d.docid)
  return docs, tasks


def _question(query_id: str, split: str, path: list[_Entity], rels: list[str], final: str) -> SearchTask:
  np = path[0].display
  for e, rel in zip(path, rels):
    np = _NP[(e.kind, rel)].format(x=np)
  last = path[-1]
  if final in last.rel:
    target = last.rel[final]
    query = ("Who is " if target.kind == "person" else "What is ") + _NP[(last.kind, final)].format(x=np) + "?"
    answer, aliases = target.name, ((target.alias,) if target.alias else ())
  else:
    query = _ATTR_QUESTION[(last.kind, final)].format(x=np)
    answer, aliases = last.attr[final], _answer_aliases(last.kind, final, last.attr[final])
  chain = []
  for i, e in enumerate(path):
    rel = rels[i] if i < len(rels) else final
    reveals = path[i + 1].name if i < len(rels) else answer
    chain.append(Hop(query=e.name, docid=e.docid, reveals=reveals, fact=e.facts[rel]))
  return SearchTask(
    query_id=query_id,
    query=_cap(query),
    answer=answer,
    aliases=aliases,
    evidence_docids=tuple(e.docid for e in path),
    chain=tuple(chain),
    split=split,
  )
