"""Build the out-of-domain prompt set: ``demo/sage_plugin_demo/data/prompts/ood_prompts.jsonl`` (100 prompts).

Five task types unlike the bundled draft's training data (``sage_plugin/train``: templated chat requests, role-play,
code, knowledge and advice questions, templated math, and summaries / extractions of CPython docstrings), 20 prompts
each, in the MT-Bench question format (``{"question_id", "category", "turns": [prompt], "source"}``):

* ``summarization``: one of four summary instructions over 20 short passages written here (town news, notices,
  product instructions, short stories, reports: no technical documentation);
* ``rag``: "answer using only the document" over the same passages, one question each, written here;
* ``translation``: 20 sentences written here, to French, German, Spanish, Italian or Portuguese;
* ``math``: multi-step word problems from five templates written here (stock, discount and tax, trip speed, tiles,
  growth), numbers from a seeded generator;
* ``table_qa``: questions over small tables (departures, prices, temperatures, stock) generated here, seeded.

All of it is the project's own text (Apache-2.0), and the file is the same on every machine.  Nothing in the serving
control or its configuration was chosen by looking at results on this set.

    .venv/bin/python tools/build_ood_prompts.py          # rewrites the file
    .venv/bin/python tools/build_ood_prompts.py --check  # exit 1 if the file differs from what it would write
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "demo" / "sage_plugin_demo" / "data" / "prompts" / "ood_prompts.jsonl"
OWN = "written for this project (tools/build_ood_prompts.py); Apache-2.0"

SUMMARY_INSTRUCTIONS = (
    "Summarize this text in two sentences.",
    "Write a one-sentence summary of the text below, then list its two most important details.",
    "Give a short summary of the following text for someone who has no time to read it.",
    "What are the three main points of the following text? Answer as a numbered list.",
)
#: (passage, question) pairs: the summaries' texts and the RAG documents
PASSAGES = (
    (
        "The town council of Marlow Creek met on Tuesday evening to discuss the future of the old flour mill on River "
        "Street. The building has stood empty for eleven years, and its roof partly collapsed during last winter's "
        "storms. Three proposals were presented: turning the mill into a community arts centre, selling the land to a "
        "housing developer, or demolishing it and extending the riverside park. After two hours of debate, the council "
        "voted five to two to commission an engineering survey before making any decision. The survey is expected to "
        "cost 18,000 dollars and to take about three months.",
        "How many council members voted against commissioning the survey?",
    ),
    (
        "Before using the Breezeline 300 fan for the first time, remove all packaging and place the fan on a flat, dry "
        "surface at least 30 centimetres from walls and curtains. The fan has three speeds, selected with the round "
        "dial on the base, and an oscillation switch on the back of the motor housing. To clean the blades, unplug the "
        "fan, unscrew the front grille by turning it anticlockwise, and wipe the blades with a damp cloth. Never use "
        "solvents or immerse any part of the fan in water. The warranty covers manufacturing defects for two years "
        "from the date of purchase.",
        "How do you remove the front grille of the fan?",
    ),
    (
        "Every spring, thousands of common cranes stop at Lake Hornborga in Sweden on their way north. The birds rest "
        "and feed in the surrounding fields for several weeks, and their dancing displays draw crowds of visitors. "
        "Local farmers once complained that the cranes damaged newly sown crops, so the county began planting "
        "potatoes on special feeding grounds to keep the birds away from private land. The arrangement has worked "
        "well: damage reports have fallen sharply, and the crane festival now brings income to hotels and cafes in "
        "the area.",
        "Why did the county start planting potatoes on special feeding grounds?",
    ),
    (
        "Mira had worked at the lighthouse for six years when the supply boat failed to arrive. At first she was not "
        "worried; storms often delayed the crossing by a day or two. But after a week, with the last tin of beans on "
        "the shelf, she climbed to the lamp room and began flashing the old signal her predecessor had taught her: "
        "three long, three short, three long. Late that night a fishing trawler answered. The crew shared their "
        "bread and coffee, and by morning the coast guard knew that the supply boat had run aground near the harbour "
        "entrance.",
        "What signal did Mira flash from the lamp room?",
    ),
    (
        "Starting on 1 March, the Riverside Public Library will change its opening hours. On weekdays the library will "
        "open at 9 a.m. instead of 10 a.m. and close at 7 p.m. On Saturdays the hours remain 10 a.m. to 4 p.m., and the "
        "library will stay closed on Sundays. The children's reading hour moves from Wednesday afternoons to Saturday "
        "mornings at 10:30. Members can still return books at any time using the drop box next to the main entrance. "
        "The changes follow a survey in which most visitors asked for earlier opening times.",
        "When will the children's reading hour take place after the change?",
    ),
    (
        "To make the lentil soup, rinse 250 grams of red lentils and set them aside. Chop one onion, two carrots and "
        "two cloves of garlic, then fry them in olive oil for about eight minutes, until soft. Add a teaspoon of ground "
        "cumin and stir for one minute. Add the lentils and 1.2 litres of vegetable stock, bring to the boil, and "
        "simmer for twenty minutes. Blend half of the soup and stir it back into the pot for a creamy texture. Season "
        "with salt, pepper and the juice of half a lemon just before serving.",
        "How long should the soup simmer after it comes to the boil?",
    ),
    (
        "The quarterly report of Halden Tools shows that sales rose by 12 percent compared with the same period last "
        "year, mainly thanks to strong demand for cordless drills in northern Europe. Profits, however, fell slightly "
        "because the price of steel increased and the company opened a new warehouse in Rotterdam. The board expects "
        "costs to stabilise in the second half of the year. It has also decided to postpone the launch of its new "
        "garden tool line until next spring, so that the factory in Bremen can first be upgraded.",
        "Why did profits fall even though sales rose?",
    ),
    (
        "Hikers planning to cross the Skarvet Pass should check the weather forecast before setting out. The trail "
        "climbs 900 metres over nine kilometres, and conditions near the top can change quickly, even in July. There is "
        "a mountain hut at the halfway point where water can be refilled, but no food is sold. Mobile phone coverage "
        "ends about two kilometres past the hut. Groups are asked to register at the visitor centre in Fossvik before "
        "leaving and to report back when they return, so that rescue teams know who is on the mountain.",
        "What are groups asked to do before they leave?",
    ),
    (
        "The Amberfield Museum has reopened its east wing after a two-year renovation. The wing now houses the museum's "
        "collection of historic clocks, including a water clock built in 1620 and a ship's chronometer that sailed "
        "around the world twice. New glass cases control humidity and temperature, which protects the delicate "
        "wooden parts. Visitors can also watch a short film about how clockmakers worked before electricity. Entry to "
        "the east wing is included in the normal ticket, and guided tours in English run every afternoon at three.",
        "What do the new glass cases control?",
    ),
    (
        "Dear team, as you know, our office will move to the fourth floor of the Cedar Building on 15 June. Please pack "
        "your personal items in the labelled boxes that will be delivered on 10 June, and leave your computers on your "
        "desks: the IT department will move them. Parking passes for the new building will be handed out at reception "
        "during the week of the move. The old office will be closed from 14 June, so anyone who needs to work that day "
        "should arrange to work from home. Thank you for your patience. Best regards, Helen.",
        "Who will move the computers?",
    ),
    (
        "The village of Santa Brisa holds a lemon festival every February. For three days the main square is decorated "
        "with sculptures made from thousands of lemons and oranges, some of them taller than a house. Local bakers sell "
        "lemon cakes and biscuits, and a brass band plays every evening. The festival began in 1952, when farmers had "
        "more fruit than they could sell and decided to turn the surplus into a celebration. Today about 40,000 people "
        "visit each year, and the fruit used in the sculptures is given to animal farms afterwards.",
        "What happens to the fruit after the festival?",
    ),
    (
        "Our new tenant agreement includes a few changes. Rent is now due on the fifth day of each month rather than the "
        "first. Tenants may keep one cat or one small dog, provided they inform the building manager in writing. "
        "Bicycles must be stored in the basement room, not in the corridors or on balconies. The laundry room is open "
        "from 7 a.m. to 10 p.m., and machines should be emptied promptly after each cycle. Any repairs should be "
        "reported through the online form, except emergencies such as water leaks, which should be reported by phone.",
        "How should a water leak be reported?",
    ),
    (
        "Astronomers at the Kestrel Observatory have observed a comet that will pass closest to the Sun in late "
        "October. The comet, named C/2031 K4, was discovered in photographs taken in January, when it was still beyond "
        "the orbit of Jupiter. Scientists expect it to become bright enough to see with binoculars in early November, "
        "low in the western sky after sunset. Whether it will be visible to the naked eye depends on how much gas and "
        "dust it releases as it warms, which is very hard to predict for a comet on its first visit to the inner solar "
        "system.",
        "Where in the sky should people look for the comet in early November?",
    ),
    (
        "Grandfather Tomas repaired radios in a small shop behind the railway station. Customers brought him sets that "
        "hissed, crackled or stayed silent, and he would listen to each one carefully before opening the case. He kept "
        "every spare part in labelled matchboxes stacked to the ceiling. When transistor radios became cheap, fewer "
        "people came, and he began repairing record players and televisions instead. He closed the shop at the age of "
        "seventy-eight and gave his tools to the technical school in town.",
        "What did Tomas do with his tools when he closed the shop?",
    ),
    (
        "The Greenway bike-sharing scheme will add 40 new stations next year, mostly in the eastern districts that are "
        "currently poorly served. Each station will hold between 12 and 20 bicycles, and half of the new bicycles will "
        "be electric. Annual membership will stay at 60 euros, but the charge for electric bicycles will rise from 5 to "
        "8 cents per minute. Users have asked for more stations near the hospital and the university, and both "
        "locations are included in the plan. Construction will begin in April and should finish by September.",
        "How much will electric bicycles cost per minute after the change?",
    ),
    (
        "Thank you for buying the Kettlecraft travel kettle. Fill the kettle with at least 0.3 and at most 0.8 litres of "
        "water; the marks are inside the body. Close the lid until it clicks, place the kettle on its base and press "
        "the switch. The light turns off when the water boils. The kettle works on both 110 and 230 volts: set the "
        "voltage selector on the base before plugging it in. To remove limescale, boil a mixture of water and white "
        "vinegar, leave it for one hour, then rinse the kettle twice with clean water.",
        "What must you do before plugging the kettle in?",
    ),
    (
        "During the drought of last summer, the farmers of the Ostra valley tried a new way of sharing water. Instead of "
        "each farm pumping from its own well, the farms agreed on a rota that gave each one the valley's pumps for a "
        "fixed number of hours per week, based on the size of its fields. A committee of five farmers checked the "
        "meters every Monday. Although yields were lower than in a normal year, no farm lost its whole harvest, and "
        "the groundwater level fell less than in the neighbouring valley, where no such agreement existed.",
        "How often did the committee check the meters?",
    ),
    (
        "The swimming pool on Harbour Road will close for maintenance from 3 to 24 July. During this time the tiles in "
        "the main pool will be replaced and a new filtration system will be installed. The children's pool and the "
        "sauna will also be closed. Members with monthly passes will have their passes extended by three weeks at no "
        "cost. Swimmers can use the pool in Northgate in the meantime; it has extended its opening hours in the "
        "evenings to make room for the extra visitors.",
        "What will members with monthly passes receive?",
    ),
    (
        "Ada ran the last kilometre of the marathon with a blister on each heel. She had trained for eight months, "
        "mostly before sunrise, and had promised herself she would not walk. At the thirty-kilometre mark she felt the "
        "familiar heaviness in her legs, but a group of children holding oranges cheered her name, which was printed on "
        "her shirt. She finished in four hours and twelve minutes, nine minutes faster than her goal, and spent the "
        "afternoon sitting in a fountain with her shoes in her hand.",
        "By how many minutes did Ada beat her goal?",
    ),
    (
        "The regional airline Northwind will start flights between Tromsø and Luleå in October. Flights will run on "
        "Mondays, Wednesdays and Fridays, leaving Tromsø at 8:15 and arriving in Luleå at 9:40 local time. The return "
        "flight leaves Luleå at 16:30. The airline will use a 70-seat turboprop aircraft, and introductory fares start "
        "at 690 kroner one way. Each passenger may bring one piece of hand luggage up to 8 kilograms; checked bags cost "
        "extra. Tickets go on sale on the airline's website next Tuesday.",
        "On which days will the flights run?",
    ),
)
SENTENCES = (
    "The library will be closed on Monday because the heating system is being repaired.",
    "Please remember to water the tomatoes twice a day while I am away.",
    "Our train was delayed by forty minutes, so we missed the beginning of the concert.",
    "The new bridge shortens the trip between the two villages by almost an hour.",
    "If the battery light turns red, plug the device in before you continue.",
    "She has been learning to play the cello for three years and practices every evening.",
    "The museum offers free guided tours on the first Sunday of each month.",
    "We need two more volunteers to help set up the tables before the festival starts.",
    "The doctor advised him to walk for half an hour every day and to drink more water.",
    "After the storm, the fishermen repaired their nets on the beach.",
    "The report must be submitted by Friday, and it should not exceed ten pages.",
    "Could you tell me where the nearest pharmacy is, and whether it is open late?",
    "The children built a small wooden boat and sailed it on the pond in the park.",
    "Prices for fresh vegetables usually fall at the end of the summer.",
    "The software update fixes a bug that caused the application to close unexpectedly.",
    "My grandmother keeps her old letters in a tin box under her bed.",
    "The hotel room had a balcony with a view of the mountains and the lake.",
    "Because of the heavy snow, the school bus will arrive one hour later tomorrow.",
    "The chef recommends the mushroom soup, which is made with herbs from the garden.",
    "The committee will announce the winners of the photography contest next week.",
)
LANGUAGES = ("French", "German", "Spanish", "Italian", "Portuguese")


def summaries() -> list[dict]:
    return [
        {"category": "summarization", "turns": [f"{SUMMARY_INSTRUCTIONS[i % 4]}\n\n{text}"], "source": OWN}
        for i, (text, _) in enumerate(PASSAGES)
    ]


def rag() -> list[dict]:
    lead = 'Answer the question using only the document below. If the document does not say, answer "not stated".'
    return [
        {"category": "rag", "turns": [f"{lead}\n\nDocument:\n{text}\n\nQuestion: {question}"], "source": OWN}
        for text, question in PASSAGES
    ]


def translations() -> list[dict]:
    return [
        {"category": "translation", "turns": [f"Translate the following sentence into {LANGUAGES[i % 5]}:\n\n{s}"],
         "source": OWN}
        for i, s in enumerate(SENTENCES)
    ]  # fmt: skip


def _math(rng: random.Random, kind: int) -> str:
    if kind == 0:
        a, b, c, d = rng.randint(120, 400), rng.randint(20, 60), rng.randint(30, 90), rng.choice((3, 4, 5, 6))
        total = a - b + c
        total -= total % d
        return (f"A warehouse starts the week with {total + b - c} boxes. On Monday {b} boxes are shipped out, and "
                f"on Tuesday {c} new boxes arrive. On Wednesday all the boxes are shared equally among {d} shops. "
                "How many boxes does each shop get? Show each step, then give the final number.")  # fmt: skip
    if kind == 1:
        price, qty, disc, tax = rng.randint(12, 80), rng.randint(3, 12), rng.choice((10, 15, 20, 25)), 8
        return (f"A jacket costs {price} dollars. A club buys {qty} jackets and gets a {disc}% discount on the "
                f"total, then pays {tax}% sales tax on the discounted amount. How much does the club pay in all? "
                "Work it out step by step and round to the cent.")  # fmt: skip
    if kind == 2:
        speed1, t1, speed2, t2 = rng.randint(40, 90), rng.randint(2, 5), rng.randint(20, 60), rng.randint(2, 4)
        return (f"A cyclist rides at {speed2} km/h for {t2} hours, then takes a bus that travels at {speed1} km/h "
                f"for {t1} hours. What is the total distance, and what is the average speed over the whole trip? "
                "Explain your reasoning.")  # fmt: skip
    if kind == 3:
        w, h, border, tile = rng.randint(6, 14), rng.randint(4, 10), rng.choice((1, 2)), rng.choice((1, 2))
        return (f"A rectangular garden is {w} m long and {h} m wide. A path {border} m wide is built all around it, "
                f"outside the garden. The path is covered with square tiles of {tile * 25} cm by {tile * 25} cm. "
                "How many tiles are needed for the path? Show the calculation.")  # fmt: skip
    a, r, n = rng.randint(2, 9), rng.choice((2, 3)), rng.randint(4, 7)
    return (f"A colony of bacteria starts with {a} thousand cells and multiplies by {r} every hour. After {n} hours "
            f"half of the colony is removed, and the rest grows for two more hours. How many cells are there at the "
            "end? Give each intermediate result.")  # fmt: skip


def maths() -> list[dict]:
    rng = random.Random(20260)
    return [{"category": "math", "turns": [_math(rng, i % 5)], "source": OWN} for i in range(20)]


def _table(rng: random.Random, kind: int) -> str:
    if kind == 0:
        cities = rng.sample(
            ["Lyon", "Porto", "Graz", "Turin", "Ghent", "Bergen", "Cork", "Kraków", "Split", "Basel"], 6
        )
        rows = [f"| {c} | {rng.randint(6, 22):02d}:{rng.choice((5, 10, 20, 35, 45, 50)):02d} | {rng.randint(1, 12)} |"
                for c in cities]  # fmt: skip
        table = "| destination | departure | platform |\n|---|---|---|\n" + "\n".join(rows)
        question = rng.choice(("Which train leaves last?", "Which platform does the earliest train leave from?",
                               f"At what time does the train to {cities[2]} leave?"))  # fmt: skip
    elif kind == 1:
        items = rng.sample(["rice", "lentils", "olive oil", "coffee", "tea", "flour", "honey", "oats", "salt"], 5)
        rows = [f"| {i} | {rng.randint(1, 9)}.{rng.randint(0, 99):02d} | {rng.randint(1, 6)} |" for i in items]
        table = "| item | price per unit (euros) | units bought |\n|---|---|---|\n" + "\n".join(rows)
        question = rng.choice(("What is the total cost of everything bought?", "Which item is the cheapest per unit?",
                               "Which item did we spend the most money on?"))  # fmt: skip
    elif kind == 2:
        days = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
        lows = [rng.randint(-4, 9) for _ in days]
        rows = [f"| {d} | {lo} | {lo + rng.randint(3, 12)} |" for d, lo in zip(days, lows, strict=True)]
        table = "| day | minimum (°C) | maximum (°C) |\n|---|---|---|\n" + "\n".join(rows)
        question = rng.choice(("On which day was the difference between maximum and minimum largest?",
                               "How many days had a minimum below zero?", "What was the average maximum?"))  # fmt: skip
    else:
        parts = rng.sample(["bolts", "washers", "hinges", "brackets", "springs", "screws", "nuts", "clamps"], 5)
        rows = [f"| {p} | {rng.randint(0, 400)} | {rng.randint(50, 150)} |" for p in parts]
        table = "| part | in stock | reorder level |\n|---|---|---|\n" + "\n".join(rows)
        question = rng.choice(("Which parts are below their reorder level?", "How many parts are in stock in total?",
                               "Which part has the most units above its reorder level?"))  # fmt: skip
    return f"Answer the question from the table. Reply with the answer only.\n\n{table}\n\nQuestion: {question}"


def tables() -> list[dict]:
    rng = random.Random(20261)
    return [{"category": "table_qa", "turns": [_table(rng, i % 4)], "source": OWN} for i in range(20)]


def build() -> list[dict]:
    sets = [summaries(), rag(), translations(), maths(), tables()]
    assert all(len(s) == 20 for s in sets), [len(s) for s in sets]
    out = []
    for records in sets:
        for i, rec in enumerate(records, 1):
            out.append({"question_id": f"ood/{rec['category']}/{i:02d}", **rec})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the shipped file differs")
    args = p.parse_args()
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in build())
    if args.check:
        return 0 if OUT.read_text() == text else 1
    OUT.write_text(text)
    print(f"wrote {OUT} ({text.count(chr(10))} prompts)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
