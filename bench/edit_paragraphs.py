"""The "repeat this paragraph, changing X to Y" prompt set of ``bench.spec_decode``: sixteen paragraphs written here
(60-120 words each, no downloaded data) and, for each, a word it contains and what to put in its place.

An editing request is the input-grounded case speculative decoding is for: a faithful answer copies the prompt but
for the edit, so drafts taken from the prompt are mostly right. Everything is fixed text, so every run and machine
sends byte-identical prompts.
"""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EditCase:
    """One paragraph and its edit: every ``old`` becomes ``new``; ``expected`` is the faithful answer."""

    paragraph: str
    old: str
    new: str

    @property
    def prompt(self) -> str:
        return (f'Repeat this paragraph word for word, changing "{self.old}" to "{self.new}" everywhere. '
                f"Reply with the paragraph only.\n\n{self.paragraph}")

    @property
    def messages(self) -> list[dict]:
        return [{"role": "user", "content": self.prompt}]

    @property
    def expected(self) -> str:
        return self.paragraph.replace(self.old, self.new)


_CASES = (
    ("The harbour town of Elmsby wakes early. Before dawn the fishing boats leave the quay, and by seven the market "
     "square is full of stalls selling bread, cheese and the morning catch. Visitors who arrive by the coastal train "
     "usually walk straight to the lighthouse, which has guided ships into Elmsby since 1821. In the afternoon the "
     "cafes along the seafront fill with people watching the tide come in, and in the evening the old chapel hosts "
     "concerts by local choirs.", "Elmsby", "Port Raven"),
    ("Our team meets every Monday at ten to review the previous week. Each person gives a short update on what they "
     "finished, what is blocked and what they plan next. The meeting should not last longer than thirty minutes, so "
     "detailed discussions are moved to a separate call. Notes are written in the shared document and sent to "
     "everyone by noon. If you cannot attend on Monday, post your update in the channel before the meeting starts.",
     "Monday", "Tuesday"),
    ("To make the soup, chop two onions and three carrots and fry them gently in butter for ten minutes. Add the "
     "lentils, a litre of stock and a pinch of salt, then let the pot simmer for half an hour. When the lentils are "
     "soft, blend the soup until it is smooth and season it with pepper and lemon juice. Serve the soup hot with "
     "fresh bread. It keeps for three days in the fridge and freezes well.", "lentils", "chickpeas"),
    ("Maria Lopez joined the company in 2015 as a junior engineer. Within three years she led the payments team, "
     "and under her direction the service moved to a new database without a single hour of downtime. Maria is known "
     "for her careful code reviews and for mentoring new hires. Outside work she runs marathons and volunteers at a "
     "coding club for teenagers. Colleagues say that Maria always asks the question nobody else thought of.",
     "Maria", "Helen"),
    ("The library will be closed on Friday for the installation of new shelving. Books that are due on Friday may be "
     "returned on Saturday without a late fee. The reading room on the second floor will reopen on Saturday morning "
     "with extra desks and better lighting. During the closure, the online catalogue and the e-book service remain "
     "available as usual. We apologise for the inconvenience and thank our readers for their patience.",
     "Friday", "Thursday"),
    ("A bicycle needs little care if you check it regularly. Pump the tyres once a week to the pressure printed on "
     "their side, and look for cuts or stones stuck in the rubber. Clean the chain every month and add a few drops "
     "of oil to each link. Test the brakes before every long ride; if the levers touch the handlebar, the cables "
     "need tightening. A bicycle looked after this way will run smoothly for many years.", "bicycle", "scooter"),
    ("The river Alder rises in the northern hills and flows for ninety kilometres to the sea. In spring the Alder "
     "often floods the low meadows near the village of Brook End, which is why the houses there stand on raised "
     "stone platforms. Herons and kingfishers nest along its banks, and anglers come from far away to fish for "
     "trout. A footpath follows the Alder from its source to its mouth and takes about four days to walk.",
     "Alder", "Wren"),
    ("Please remember that the office kitchen is shared by everyone on this floor. Wash your cups and plates after "
     "use and do not leave them in the sink. Food in the fridge must be labelled with your name and the date, and "
     "anything older than a week is thrown away on Friday afternoon. The coffee machine is descaled on the first of "
     "every month; during that hour, please use the kettle instead.", "kitchen", "pantry"),
    ("The museum's new exhibition tells the story of the telescope, from the first simple lenses of the seventeenth "
     "century to the great mirrors on today's mountain tops. Visitors can look through a copy of an early telescope "
     "and compare its blurry view with photographs taken by modern instruments. A separate room explains how "
     "astronomers measure the distance to the stars. The exhibition is open daily until the end of March.",
     "telescope", "microscope"),
    ("Green Valley Farm grows apples, pears and plums on forty hectares of rolling land. The orchards were planted by "
     "the founder's grandfather, and some of the oldest trees are still producing fruit. In autumn the farm opens to "
     "the public for picking days, when families can fill baskets and buy fresh juice from the barn. Green Valley "
     "Farm also sells jam and cider at the weekly market in town.", "apples", "cherries"),
    ("When you start the application for the first time, it asks you to choose a password. The password must be at "
     "least twelve characters long and should not contain your name. After you confirm the password, the "
     "application creates your profile and shows a short tour of its main screens. You can skip the tour and open it "
     "later from the help menu. Your settings are saved automatically whenever you change them.",
     "password", "passphrase"),
    ("The city council has approved a plan to plant five thousand trees over the next four years. Most of the trees "
     "will line the main roads, where they will give shade in summer and reduce noise from traffic. Residents can "
     "ask for a tree outside their home by filling in a form on the council website. The council will pay for the "
     "trees and their care for the first three years, after which the parks department takes over.",
     "council", "municipality"),
    ("Professor Ahmed Karimi teaches an introductory course on probability every autumn. His lectures start with "
     "simple games of dice and cards and move on to the ideas behind weather forecasts and medical tests. Students "
     "say the course is hard but fair, and that Ahmed explains every formula with an example first. At the end of "
     "the term each student writes a short project that applies probability to a question they care about.",
     "Ahmed", "Samir"),
    ("Our hotel is a ten-minute walk from the central station. Each room has a private bathroom, a desk and free "
     "wireless internet, and most rooms on the upper floors look out over the old town. Breakfast is served in the "
     "garden room from seven until ten. The reception is open day and night, and our staff will gladly book tickets "
     "for museums, concerts and boat trips on the lake. Guests can leave their luggage with us after check-out.",
     "hotel", "guesthouse"),
    ("The spring concert of the school orchestra takes place on the twelfth of May in the main hall. The orchestra "
     "will play music by Mozart, Dvorak and two pieces written by students of the final year. Tickets are free for "
     "pupils and cost five pounds for adults; all money raised goes towards new instruments. Doors open at half "
     "past six, and the orchestra begins at seven. Light refreshments will be served during the interval.",
     "orchestra", "choir"),
    ("Every evening Tom walks his dog along the canal. They leave the house at six, pass the old mill and cross the "
     "iron bridge before turning back at the lock. The dog knows the route so well that it stops at every bench "
     "where Tom usually rests. On rainy days the walk is shorter, but they never skip it. Neighbours say they can "
     "set their clocks by Tom and his dog coming home along the towpath.", "dog", "spaniel"),
)

CASES = tuple(EditCase(paragraph, old, new) for paragraph, old, new in _CASES)


def edit_cases(limit: int | None = None) -> list[EditCase]:
    """The first ``limit`` cases (all sixteen by default), in their fixed order."""
    return list(CASES if limit is None else CASES[:limit])
