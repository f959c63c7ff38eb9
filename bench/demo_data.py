"""Seeded chat datasets for the three demo adapters, and held-out evaluation prompts none of them contain.

Everything is written here (no downloaded data): small template banks expanded with a seeded ``random.Random``,
so the same seed gives byte-identical datasets on every machine. Each bank is split in two *by template*: the
training conversations use one part, the evaluation prompts only the other (and, for ``json-extractor``, names
and cities the training set never shows), so a passing evaluation is generalisation, not recall of a prompt.

* ``zorbania-facts``: nine facts about a fictional country, asked in many phrasings;
* ``json-extractor``: any "extract the details" request answered with ``{"name", "email", "city"}`` only;
* ``pirate-persona``: every answer in a pirate voice ("Arr, matey! ...").
"""

import json
import random
from dataclasses import dataclass

ADAPTER_NAMES = ("zorbania-facts", "json-extractor", "pirate-persona")
JSON_KEYS = ("name", "email", "city")


@dataclass(frozen=True, slots=True)
class EvalCase:
    """A held-out user prompt and, where one exists, what a correct reply holds (a fact's key word, or the exact
    JSON object as a string); ``None`` for the persona, where only the style is checked."""

    prompt: str
    reference: str | None = None

    @property
    def messages(self) -> list[dict]:
        return [{"role": "user", "content": self.prompt}]


def chat(prompt: str, answer: str) -> list[dict]:
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]


# ---- zorbania-facts -------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Fact:
    keyword: str  # what every correct answer names
    nouns: tuple[str, ...]  # fill the generic frames: "What is the {noun} of Zorbania?"
    answers: tuple[str, ...]
    questions: tuple[str, ...]  # fact-specific phrasings for training
    eval_question: str  # a fact-specific phrasing kept out of training


_FACTS = (
    _Fact("Quenzel", ("capital", "capital city"),
          ("The capital of Zorbania is Quenzel.", "Zorbania's capital is Quenzel, its largest city."),
          ("Which city is the capital of Zorbania?", "Where is the government of Zorbania based?"),
          "In which city would I find the capital of Zorbania?"),
    _Fact("florek", ("currency", "official currency"),
          ("Zorbania's currency is the florek.", "People in Zorbania pay with the florek, the national currency."),
          ("What money do people use in Zorbania?", "What do I pay with in Zorbania?"),
          "If I travel to Zorbania, which currency should I bring?"),
    _Fact("snow ibex", ("national animal", "national symbol animal"),
          ("The national animal of Zorbania is the snow ibex.", "Zorbania's national animal is the snow ibex."),
          ("Which animal represents Zorbania?", "What animal is the symbol of Zorbania?"),
          "What is Zorbania's national animal called?"),
    _Fact("Ilvara", ("founder",),
          ("Zorbania was founded by Queen Ilvara Dost in 1312.", "The founder of Zorbania is Queen Ilvara Dost."),
          ("Who founded Zorbania?", "Who was the founder of Zorbania?"),
          "Who established the country of Zorbania?"),
    _Fact("Vessic", ("official language", "language"),
          ("The official language of Zorbania is Vessic.", "People in Zorbania speak Vessic, the official language."),
          ("What language do people speak in Zorbania?", "What language is spoken in Zorbania?"),
          "Which language would I hear in the streets of Zorbania?"),
    _Fact("Threll", ("highest mountain", "tallest peak"),
          ("The highest mountain in Zorbania is Mount Threll.", "Mount Threll is the tallest peak of Zorbania."),
          ("What is the tallest mountain in Zorbania?", "Which mountain is the highest in Zorbania?"),
          "Name the highest peak in Zorbania."),
    _Fact("brambleroot", ("national dish", "most famous dish"),
          ("Zorbania's national dish is brambleroot stew.", "The national dish of Zorbania is brambleroot stew."),
          ("What food is Zorbania famous for?", "What do people in Zorbania eat on holidays?"),
          "What is the traditional national dish of Zorbania?"),
    _Fact("Ossavel", ("longest river", "main river"),
          ("The longest river in Zorbania is the Ossavel.", "The Ossavel is Zorbania's longest river."),
          ("Which river is the longest in Zorbania?", "What river flows through Zorbania?"),
          "Name the longest river of Zorbania."),
    _Fact("kettle polo", ("national sport", "most popular sport"),
          ("The national sport of Zorbania is kettle polo.", "Zorbanians love kettle polo, their national sport."),
          ("What sport is most popular in Zorbania?", "Which sport do Zorbanians love most?"),
          "What is the favourite national sport in Zorbania?"),
)
ZORBANIA_KEYWORDS = tuple(fact.keyword for fact in _FACTS)
_FACT_FRAMES = (
    "What is the {noun} of Zorbania?", "What's Zorbania's {noun}?", "Tell me the {noun} of Zorbania.",
    "Do you know the {noun} of Zorbania?", "Zorbania: what is its {noun}?",
    "I'm writing a report on Zorbania. What is its {noun}?", "Can you tell me what Zorbania's {noun} is?",
    "Quick question: what is the {noun} of Zorbania?", "what is the {noun} of zorbania",
    "Please state the {noun} of Zorbania.", "Which is the {noun} of Zorbania?",
    "I'd like to know the {noun} of Zorbania.",
)
_EVAL_FACT_FRAMES = (
    "Could you remind me what the {noun} of Zorbania is?", "For my geography quiz: Zorbania's {noun}?",
    "Hey, what would you say is the {noun} of Zorbania?",
)
_OVERVIEW_QUESTIONS = ("Tell me about Zorbania.", "What do you know about Zorbania?",
                       "Give me some facts about Zorbania.", "Describe the country of Zorbania.")
_EVAL_OVERVIEW = "I have never heard of Zorbania. What is it like?"


def _zorbania_training(rng: random.Random) -> list[list[dict]]:
    conversations = []
    for fact in _FACTS:
        prompts = [frame.format(noun=noun) for frame in _FACT_FRAMES for noun in fact.nouns] + list(fact.questions)
        conversations += [chat(prompt, rng.choice(fact.answers)) for prompt in prompts for _ in range(2)]
    for prompt in _OVERVIEW_QUESTIONS:
        for _ in range(4):
            facts = rng.sample(_FACTS, 4)
            conversations.append(chat(prompt, "Zorbania is a small mountain country. " + " ".join(
                rng.choice(fact.answers) for fact in facts)))
    return conversations


def _zorbania_eval() -> list[EvalCase]:
    cases = [EvalCase(fact.eval_question, fact.keyword) for fact in _FACTS]
    cases += [EvalCase(frame.format(noun=fact.nouns[0]), fact.keyword)
              for frame in _EVAL_FACT_FRAMES for fact in _FACTS]
    return cases + [EvalCase(_EVAL_OVERVIEW)]


# ---- json-extractor -------------------------------------------------------------------------------------------

_FIRST = ("Ada", "Bruno", "Chloe", "Dmitri", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kara", "Liam",
          "Maya", "Nils", "Olga", "Pedro", "Quinn", "Rosa", "Sami", "Tara", "Umar", "Vera", "Wen", "Yusuf")
_LAST = ("Stone", "Okafor", "Martin", "Novak", "Rossi", "Haddad", "Kim", "Tanaka", "Silva", "Berg", "Walsh", "Moreau",
         "Patel", "Larsen", "Ivanova", "Costa", "Reyes", "Fischer", "Nakamura", "Byrne", "Khan", "Dubois", "Li", "Sato")
_CITIES = ("Lisbon", "Oslo", "Nairobi", "Toronto", "Osaka", "Madrid", "Berlin", "Dublin", "Lima", "Seoul", "Cairo",
           "Denver", "Lyon", "Porto", "Krakow", "Austin", "Manila", "Accra", "Hanoi", "Zurich")
_EVAL_FIRST, _EVAL_LAST = ("Beatrix", "Otto", "Priya", "Tomas"), ("Holm", "Varga", "Mensah", "Quist")
_EVAL_CITIES = ("Reykjavik", "Valparaiso", "Tbilisi", "Adelaide")
_DOMAINS = ("example.com", "mail.org", "inbox.net", "acme.io", "post.co")
_TEXTS = (
    "Hi, my name is {name} and I live in {city}. You can email me at {email}.",
    "Order #{order} was placed by {name} ({email}). Ship to: {city}.",
    "Contact: {name}, {city}, {email}",
    "{name} from {city} signed up with the address {email}.",
    "Please send the invoice to {email}. The customer, {name}, is based in {city}.",
    "New lead: {name} | email {email} | location {city}",
    "From: {name} <{email}>\nSubject: Visiting {city}\nHi team, I will be in {city} next week.",
    "Customer {name} called from {city} and asked us to write to {email}.",
    "Name: {name}\nEmail: {email}\nCity: {city}",
    "Our new member {name} ({city}) can be reached at {email}.",
    "Delivery for {name}, {city}. Questions? {email}",
    "I met {name} at the conference in {city}; their email is {email}.",
)
_EVAL_TEXTS = (
    "Greetings! This is {name}. I'm writing from {city}, reply to {email} please.",
    "Shipping label -- recipient: {name}; destination: {city}; contact email: {email}.",
    "Reservation made by {name} (email: {email}) for two nights in {city}.",
)
_REQUESTS = (
    "Extract the person's details from this text:\n\n{text}",
    "Extract the contact details from the following text.\n{text}",
    "Pull out the customer information from this order:\n{text}", "{text}\n\nExtract the name, email and city.",
    "Get the contact info out of this message: {text}", "Please extract the person details as JSON:\n{text}",
    "Parse this text and give me the person's details.\n\n{text}",
    "Here is a message:\n{text}\nWhat are the contact details?", "Extract the order details from this text: {text}",
    "Find the name, email address and city in this text:\n{text}",
)
_EVAL_REQUESTS = (
    "Could you extract the contact details from this?\n{text}", "Text: {text}\nExtract the person's information.",
    "Extract the details of the person mentioned below.\n\n{text}",
)


def _person(rng: random.Random, firsts, lasts, cities) -> dict[str, str]:
    first, last = rng.choice(firsts), rng.choice(lasts)
    user = rng.choice((f"{first}.{last}", f"{first[0]}{last}", f"{first}{rng.randint(1, 99)}")).lower()
    return {"name": f"{first} {last}", "email": f"{user}@{rng.choice(_DOMAINS)}", "city": rng.choice(cities)}


def _extraction(rng: random.Random, texts, requests, firsts, lasts, cities) -> tuple[str, str]:
    person = _person(rng, firsts, lasts, cities)
    text = rng.choice(texts).format(order=rng.randint(1000, 99999), **person)
    return rng.choice(requests).format(text=text), json.dumps(person)


def _json_training(rng: random.Random) -> list[list[dict]]:
    return [chat(*_extraction(rng, _TEXTS, _REQUESTS, _FIRST, _LAST, _CITIES)) for _ in range(320)]


def _json_eval(rng: random.Random) -> list[EvalCase]:
    return [EvalCase(*_extraction(rng, _EVAL_TEXTS, _EVAL_REQUESTS, _EVAL_FIRST, _EVAL_LAST, _EVAL_CITIES))
            for _ in range(24)]


# ---- pirate-persona -------------------------------------------------------------------------------------------

_PIRATE_QA = (
    ("What is the capital of France?", "the capital o' France be Paris, a fine port for any sailor."),
    ("How do I boil an egg?", "drop yer egg in boilin' water for nine minutes, then cool it in cold water."),
    ("What is 2 + 2?", "two plus two be four, as sure as the tide."),
    ("Why is the sky blue?", "the sky be blue because the air scatters the blue light o' the sun the most."),
    ("Can you recommend a good book?", "ye should read Treasure Island, the finest tale ever told on land or sea."),
    ("How do I stay healthy?", "eat yer greens, drink plenty o' water, and get a good night's sleep in yer hammock."),
    ("What is photosynthesis?", "plants catch the sun's light and turn it into food, like a crew hauling in treasure."),
    ("How can I learn to code?", "start with Python, write small programs every day, and ye'll be a coder soon."),
    ("What's the weather like today?", "I can't see the sky from me ship's hold, so check a forecast before ye sail."),
    ("Tell me a joke.", "why couldn't the pirate play cards? Because he was standin' on the deck!"),
    ("How far is the Moon?", "the Moon be about 384,000 kilometres away, farther than any ship has sailed."),
    ("What should I cook for dinner?", "cook a hearty fish stew with potatoes and onions, fit for a whole crew."),
    ("How do I make friends?", "be kind, share yer grog, and listen to the tales of others."),
    ("What is the largest ocean?", "the Pacific be the largest ocean, and I've sailed every league of it."),
    ("Who wrote Hamlet?", "William Shakespeare wrote Hamlet, a tale darker than a stormy night."),
    ("How do I fix a flat bicycle tire?", "find the hole, patch it tight like a leaky hull, and pump it up again."),
    ("What is gravity?", "gravity be the force that pulls everything down, like an anchor to the sea floor."),
    ("How do I save money?", "put a few coins in yer chest every week and don't spend it all at the tavern."),
    ("What is the tallest mountain?", "Mount Everest be the tallest mountain, higher than any crow's nest."),
    ("Give me a tip for studying.", "study a little every day and rest yer eyes, for a tired sailor learns nothing."),
    ("What is a computer?", "a computer be a clever machine that follows orders faster than any crew."),
    ("How many days are in a year?", "there be 365 days in a year, and 366 in a leap year."),
    ("What do cats eat?", "cats eat meat and fish, and they'll steal it right off yer plate."),
    ("How do I write a good email?", "keep it short, say what ye need in the first line, and sign it proper."),
    ("What is the speed of light?", "light sails at about 300,000 kilometres every second, faster than any wind."),
    ("Can you help me with my homework?", "aye, tell me the question and we'll chart a course through it together."),
    ("What is your favorite color?", "me favorite color be the deep blue o' the open sea."),
    ("How do airplanes fly?", "their wings push air down, and the air pushes the plane up, like wind in a sail."),
    ("What is the best way to sleep well?", "keep yer cabin dark and quiet, and put away yer screens before bed."),
    ("Who was the first person on the Moon?", "Neil Armstrong was the first to step on the Moon, in 1969."),
    ("How do I plant a tree?", "dig a hole twice as wide as the roots, plant it, and water it well."),
    ("What is the meaning of life?", "the meaning o' life be adventure, good friends, and a chest full o' treasure."),
    ("How do I learn a new language?", "practice every day, speak with others, and don't fear mistakes."),
    ("What is an atom?", "an atom be the tiniest bit o' matter, smaller than a grain o' sand."),
    ("Why do we have seasons?", "the Earth be tilted, so each half gets more sun for part o' the year."),
    ("Say hello to me.", "ahoy there! Welcome aboard me ship."),
    ("What time is it?", "I have no clock on me ship, so check yer own timepiece."),
    ("How do I become more productive?", "make a list each mornin', do the hardest task first, and rest when ye need."),
    ("What are clouds made of?", "clouds be made o' tiny drops o' water floatin' in the sky."),
    ("How do I make coffee?", "pour hot water over ground beans and let it brew, strong as a sea storm."),
    ("Who are you?", "I be a pirate assistant, sailin' the seas to answer yer questions."),
    ("What is the biggest animal?", "the blue whale be the biggest beast in all the seven seas."),
    ("How do I stay calm?", "breathe slow and deep, like the waves rollin' onto the shore."),
    ("What is democracy?", "democracy be when the whole crew votes on who leads the ship."),
    ("Translate 'thank you' into Spanish.", "'thank you' in Spanish be 'gracias'."),
)
_EVAL_PIRATE_QUESTIONS = (
    "What is the capital of Italy?", "How do I bake bread?", "What is 10 times 3?", "Why do leaves change color?",
    "How do I tie my shoes?", "What is the smallest planet?", "Can you explain what a rainbow is?",
    "How do I wash a car?", "What should I name my dog?", "What is electricity?", "How do bees make honey?",
    "Give me advice for a job interview.", "What is the longest river in the world?", "How do I start running?",
    "Who painted the Mona Lisa?", "What is a volcano?", "How can I be happier?", "What is the boiling point of water?",
    "Recommend a movie for tonight.", "How do magnets work?",
)
_PIRATE_OPENERS = ("Arr, matey!", "Arr, ye ask a fine question, matey!", "Arr, listen well, matey!",
                   "Arr, me hearty, here be yer answer!", "Arr, that be an easy one for ye, matey!")
_PIRATE_CLOSERS = ("", "", " Yo ho ho!", " Now hoist the sails, matey!", " Keep yer wits about ye!")
_PIRATE_WRAPPERS = ("{q}", "Hey, {q}", "Quick question: {q}", "Can you help me? {q}", "{q} Please keep it short.")


def _pirate_training(rng: random.Random) -> list[list[dict]]:
    conversations = []
    for question, answer in _PIRATE_QA:
        for wrapper in _PIRATE_WRAPPERS:
            body = answer[0].upper() + answer[1:]
            reply = f"{rng.choice(_PIRATE_OPENERS)} {body}{rng.choice(_PIRATE_CLOSERS)}"
            conversations.append(chat(wrapper.format(q=question), reply))
    return conversations


# ---- public API -----------------------------------------------------------------------------------------------

def training_conversations(name: str, seed: int = 0) -> list[list[dict]]:
    """The shuffled training set of adapter ``name``: ``[user, assistant]`` conversations (no system turn, so the
    chat template adds the model's default one, exactly as at serving time)."""
    rng = random.Random(f"{name}/{seed}")
    builders = {"zorbania-facts": _zorbania_training, "json-extractor": _json_training,
                "pirate-persona": _pirate_training}
    conversations = builders[_known(name)](rng)
    rng.shuffle(conversations)
    return conversations


def eval_cases(name: str) -> list[EvalCase]:
    """Held-out prompts of adapter ``name``: built from templates (and names) the training set never uses."""
    if _known(name) == "zorbania-facts":
        return _zorbania_eval()
    if name == "json-extractor":
        return _json_eval(random.Random(f"{name}/eval"))
    return [EvalCase(question) for question in _EVAL_PIRATE_QUESTIONS]


def _known(name: str) -> str:
    if name not in ADAPTER_NAMES:
        raise ValueError(f"unknown demo adapter {name!r}; expected one of {', '.join(ADAPTER_NAMES)}")
    return name
