"""Sentence templates of the synthetic world's pages: the data `world.py` renders facts with."""

# Page text. Per type: lead variants, then groups of variants, one variant of each group per page.
# The lead and the groups before the last one or two state every attribute and relation whichever
# variant is picked; the last groups only restate the entity's own facts in other words.

TEMPLATES: dict[str, tuple[tuple[str, ...], ...]] = {
    "person": (
        (
            "{name} (born {birth_year}) {is} {a_occupation}.",
            "{name} {is} {a_occupation}, born in {birth_year}.",
            "{name}, born {birth_year}, {is} {a_occupation} by profession.",
        ),
        (
            "{short} was born in {born_in}.",
            "{short}'s birthplace is the city of {born_in}.",
            "{short} grew up in {born_in}, the city of their birth.",
        ),
        (
            "{short} studied at {studied_at}.",
            "{short} was educated at {studied_at}.",
            "As a young adult, {short} attended {studied_at}.",
        ),
        (
            "{short} worked for {employer}.",
            "For a number of years {short} was employed by {employer}.",
            "{short} later joined the staff of {employer}.",
        ),
        (
            "Accounts of {short}'s life give a prominent place to the years at {studied_at}.",
            "People in {born_in} still speak of {short} as one of the city's own.",
            "Among the colleagues {short} met at {employer}, several became lifelong friends.",
        ),
        (
            "{short}'s time at {employer} is documented in the company's own records.",
            "Letters sent from {born_in} to friends at {studied_at} give a vivid picture of {short}'s early years.",
            "Biographers usually begin the story of {short} in {born_in}.",
        ),
    ),
    "city": (
        (
            "{name} is a city in {country}.",
            "{name} is a city located in {country}.",
            "{name} is one of the cities of {country}.",
        ),
        (
            "It has a population of {population}.",
            "{name} is home to {population} people.",
            "The population of {name} is {population}.",
        ),
        (
            "The city was founded in {founded_year}.",
            "{name} was founded in {founded_year}.",
            "Records date the founding of {name} to {founded_year}.",
        ),
        (
            "The mayor of {name} is {mayor}.",
            "{mayor} serves as mayor of {name}.",
            "The city is led by its mayor, {mayor}.",
        ),
        (
            "As a city of {country}, {name} shares in the country's long traditions of trade and craft.",
            "Travellers reaching {name} usually arrive by road or rail from elsewhere in {country}.",
            "Many people in {country} know {name} for its markets and its old quarter.",
        ),
        (
            "Under {mayor}, the city council has debated plans for new parks and better public transport.",
            "The office of {mayor} looks out over the main square of {name}.",
            "{mayor} is a familiar figure at public events around {name}.",
        ),
    ),
    "country": (
        (
            "{name} is a country whose capital is {capital}.",
            "{name} is a sovereign state with its capital at {capital}.",
            "{name} is a country; its capital and seat of government is {capital}.",
        ),
        (
            "{name} has a population of {population}.",
            "The country is home to {population} people.",
            "The population of {name} is {population}.",
        ),
        (
            "The official language is {official_language}.",
            "{official_language} is the official language of {name}.",
            "Government business in {name} is conducted in {official_language}, the official language.",
        ),
        (
            "Its currency is the {currency}.",
            "{name} uses the {currency} as its currency.",
            "The national currency is the {currency}.",
        ),
        (
            "Most visitors to {name} arrive through {capital}, where the main government offices stand.",
            "Street signs, newspapers and schoolbooks throughout {name} are printed in {official_language}.",
            "Prices in the markets of {capital} are quoted in the {currency}, as everywhere else in {name}.",
        ),
        (
            "The government of {name} sits in {capital}.",
            "Coins and notes of the {currency} carry images of landscapes from across {name}.",
            "Schools across {name} teach in {official_language}.",
        ),
    ),
    "company": (
        (
            "{name} is {a_industry} company headquartered in {headquarters}.",
            "{name} is a company in the {industry} industry, based in {headquarters}.",
            "Headquartered in {headquarters}, {name} is a company in the {industry} business.",
        ),
        (
            "{name} was founded in {founded_year} by {founded_by}.",
            "{founded_by} founded {name} in {founded_year}.",
            "The company was established by {founded_by} in {founded_year}.",
        ),
        (
            "It employs {employees} people.",
            "{name} has {employees} employees.",
            "The company has a workforce of {employees}.",
        ),
        (
            "{founded_by} is still remembered inside {name} as the person who started it all.",
            "From its offices in {headquarters}, {name} oversees all of its work in the {industry} field.",
            "The story of {name} is closely tied to {headquarters}, where it has long been a familiar employer.",
        ),
        (
            "Since its founding in {founded_year}, {name} has changed premises and products more than once.",
            "{name} has kept its main offices in {headquarters} for most of its history.",
            "Industry observers regard {name} as a typical {industry} business of its region.",
        ),
    ),
    "university": (
        (
            "{name} is a university in {located_in}.",
            "{name} is a public university located in {located_in}.",
            "{name} is a research university based in {located_in}.",
        ),
        (
            "It was founded in {founded_year} by {founded_by}.",
            "{founded_by} established the university in {founded_year}.",
            "The university was founded by {founded_by} in {founded_year}.",
        ),
        ("It has {students} students.", "{name} enrolls {students} students.", "The student body numbers {students}."),
        (
            "{name} is one of the best known institutions in {located_in}.",
            "A portrait of {founded_by} hangs in the entrance hall of {name}.",
            "The university has long been part of everyday life in {located_in}, where many of its staff live.",
        ),
        (
            "Since its founding in {founded_year}, {name} has grown and changed in many ways.",
            "The founder, {founded_by}, is commemorated each year in a short ceremony.",
            "Life at {name} is shaped by the rhythms of {located_in}.",
        ),
    ),
    "river": (
        (
            "The {name} is a river in {flows_through}.",
            "The {name} is a river that flows through {flows_through}.",
            "The {name} flows through {flows_through}.",
        ),
        (
            "It is {length_km} long.",
            "The river has a length of {length_km}.",
            "The {name} runs for {length_km} from its source to its mouth.",
        ),
        (
            "Its source is on {source}.",
            "The river rises on the slopes of {source}.",
            "The {name} has its source at {source}.",
        ),
        (
            "Its whole course lies within {flows_through}, and it is one of the better known rivers there.",
            "For much of its length the {name} is a familiar sight to the people of {flows_through}.",
            "Maps of {flows_through} show the river winding away from the high ground around {source}.",
        ),
        (
            "Near its source on {source}, the {name} is little more than a mountain stream.",
            "The {name} is fed by many small tributaries along its {length_km} course.",
            "Boat trips on the {name} are a popular way to see the countryside of {flows_through}.",
        ),
    ),
    "mountain": (
        (
            "{name} is a mountain in {country}.",
            "{name} is a peak located in {country}.",
            "{name} is a mountain that rises in {country}.",
        ),
        (
            "It has an elevation of {elevation_m}.",
            "Its summit stands {elevation_m} above sea level.",
            "{name} reaches {elevation_m} at its highest point.",
        ),
        (
            "Most routes to the summit begin in the villages of {country} that lie at its foot.",
            "The mountain is a well known landmark in {country}, visible from far across the lowlands.",
            "Walkers in {country} often name {name} among their favourite climbs.",
        ),
        (
            "At {elevation_m}, the summit is often wrapped in cloud while the valleys below lie in sunshine.",
            "The view from the {elevation_m} summit rewards those who make the long climb.",
            "Weather stations record strong winds on the summit, {elevation_m} above the sea.",
        ),
        (
            "Geologists have long studied the rocks of {name}.",
            "{name} appears on many postcards and posters sold in {country}.",
            "Its shape makes {name} easy to recognise from the plains of {country}.",
        ),
    ),
    "film": (
        (
            "{name} is a {release_year} {genre} film.",
            "{name} is {a_genre} film released in {release_year}.",
            "Released in {release_year}, {name} is {a_genre} film.",
        ),
        (
            "It was directed by {directed_by}.",
            "{directed_by} directed the film.",
            "The film was directed by {directed_by}.",
        ),
        (
            "It was filmed in {filmed_in}.",
            "Principal photography took place in {filmed_in}.",
            "The film was shot on location in {filmed_in}.",
        ),
        (
            "It is based on the book {based_on}.",
            "The screenplay is adapted from {based_on}.",
            "The film is an adaptation of {based_on}.",
        ),
        (
            "For {directed_by}, bringing {based_on} to the screen was a long-held ambition.",
            "Scenes shot around {filmed_in} give the film much of its atmosphere.",
            "Readers of {based_on} have long debated how faithful the adaptation is.",
        ),
        (
            "Local people in {filmed_in} appeared as extras in several scenes.",
            "{directed_by} is said to have rewritten parts of the script during filming.",
            "The {release_year} premiere drew a large and curious crowd.",
        ),
    ),
    "book": (
        (
            "{name} is {a_genre} by {written_by}.",
            "{name} is {a_genre} written by {written_by}.",
            "Written by {written_by}, {name} is {a_genre}.",
        ),
        (
            "It was published in {publication_year} by {publisher}.",
            "{publisher} published the book in {publication_year}.",
            "The book first appeared in {publication_year}, published by {publisher}.",
        ),
        (
            "{written_by} worked on the manuscript for several years before it was finished.",
            "It is often described as the best known work of {written_by}.",
            "Admirers of {written_by} regard it as a turning point in the author's career.",
        ),
        (
            "{publisher} has kept the book in its catalogue for many years.",
            "Copies of the {publication_year} first edition are now prized by collectors.",
            "The first edition from {publisher} is now sought after by collectors.",
        ),
        (
            "{written_by} gave readings from the book in many towns.",
            "The {genre} has been reissued several times since {publication_year}.",
            "Critics writing in {publication_year} gave the book a warm welcome.",
        ),
    ),
    "event": (
        (
            "{name} took place in {location} in {year}.",
            "{name} was held in {location} in {year}.",
            "Held in {location} in {year}, {name} drew visitors from across the region.",
        ),
        (
            "It was organised by {organised_by}.",
            "{organised_by} organised the event.",
            "The event was organised by {organised_by}.",
        ),
        (
            "It drew an attendance of {attendance}.",
            "Attendance reached {attendance}.",
            "The event was attended by {attendance} people.",
        ),
        (
            "For {organised_by}, it was one of the most ambitious projects it had undertaken.",
            "Streets across {location} were decorated for the occasion.",
            "Many residents of {location} still remember the crowds that gathered for {name}.",
        ),
        (
            "Preparations for the {year} event took many months.",
            "Guests travelled to {location} from many parts of the surrounding region.",
            "{organised_by} published a short account of the event afterwards.",
        ),
    ),
}

CAPITAL_TEMPLATES = ("It is the capital of {country}.", "{name} serves as the capital of {country}.")

# Fact-free flavour: true of any entity of its type, so it can never contradict a fact.
FLAVOUR: dict[str, tuple[str, ...]] = {
    "person": (
        "Colleagues remembered {short} as patient, exacting and unusually generous with their time, "
        "especially towards younger people just starting out.",
        "Several notebooks kept by {short} survive, filled with sketches, lists of books to read and "
        "half-finished ideas that were never pursued.",
        "{short} was known for long walks before breakfast and a stubborn habit of answering every letter by hand.",
        "Friends described a quiet, dry sense of humour that rarely showed in public but made private "
        "gatherings memorable.",
        "Later writers have disagreed about how much of the early work {short} completed alone and how much "
        "was shared with friends.",
        "{short} rarely gave interviews and preferred to let the work speak for itself, which only added to "
        "a certain air of mystery.",
        "Accounts from the period describe {short} as restless, curious and hard to impress, yet loyal to a "
        "small circle of friends.",
    ),
    "city": (
        "The old town is known for its narrow lanes, stone bridges and crowded weekend markets, where "
        "traders sell fruit, cheese and secondhand books.",
        "Its skyline is dominated by a clock tower that has been rebuilt more than once after fires and storms.",
        "Residents are proud of the public gardens that line the waterfront promenade, which fill with "
        "families on summer evenings.",
        "Visitors often remark on the many small bakeries and the smell of fresh bread that drifts through "
        "the streets in the early morning.",
        "Several festivals fill the central square during the warmer months, drawing musicians and street "
        "performers from the surrounding towns.",
        "The city's tram network is small but much loved, and its old green carriages appear on countless postcards.",
        "Local legend holds that the first settlers arrived by boat during a storm and stayed because the "
        "harbour was calm.",
    ),
    "country": (
        "The landscape ranges from rolling farmland and orchards to rugged, thinly populated uplands where "
        "sheep outnumber people.",
        "Its cuisine is known for slow-cooked stews, dark rye bread and strong coffee served with something sweet.",
        "The national flag features a pale band that is traditionally said to represent the morning mist "
        "over the valleys.",
        "Folk music and dance remain popular at village celebrations, and many towns keep their own brass band.",
        "Travel writers often praise the hospitality of its small mountain towns and the patience of its "
        "railway timetables.",
        "Winters are long and snowy in the north, while the south enjoys a milder climate suited to vineyards.",
        "Stories of clever foxes and foolish kings are told to children in every region of the country.",
    ),
    "company": (
        "The business began as a small workshop with a handful of employees and grew steadily over the "
        "following decades.",
        "Its logo, a simple stylised bird, has changed little since the early years and is widely recognised.",
        "{name} is known in the trade for reliable products, cautious management and a dislike of publicity.",
        "The firm has weathered several economic downturns by keeping its debts low and its ambitions modest.",
        "Staff often describe a close-knit culture that values long service, practical skill and plain speaking.",
        "Its original premises have since been converted into a small museum that is open to visitors on weekends.",
        "Over the years {name} has sponsored local sports clubs, music schools and a summer reading programme.",
    ),
    "university": (
        "The campus is known for its courtyard gardens and a large, high-ceilinged reading room that is "
        "open late into the night.",
        "Its library holds an extensive collection of old maps, letters and rare manuscripts donated by "
        "former students.",
        "Students organise a lively calendar of debates, concerts and rowing races, some of them with long "
        "and peculiar traditions.",
        "The university motto, carved above the main gate, is taken from an old proverb about patience.",
        "Research groups there have a reputation for careful fieldwork and for sharing their data freely.",
        "Graduation ceremonies are held each summer in the great hall, followed by a picnic on the lawns.",
        "The oldest building on campus has a bell that still marks the hour and, by tradition, the start of exams.",
    ),
    "river": (
        "Its banks are lined with willows, water meadows and the ruins of old mills that once ground grain "
        "for the surrounding farms.",
        "The river is popular with anglers, rowers and birdwatchers, especially along its quieter middle reaches.",
        "Several stone bridges cross it, some of them centuries old and still carrying traffic today.",
        "In spring the water runs high and fast with snowmelt, and low-lying fields sometimes flood.",
        "Barges once carried timber and grain along its lower reaches before the railways took their trade.",
        "Otters and kingfishers can still be seen along the stretches where the current slows.",
        "Local stories tell of a drowned village that lies beneath one of its deepest pools.",
    ),
    "mountain": (
        "Its slopes are covered in pine forest that gives way to meadows and then to bare rock near the summit.",
        "Hikers usually approach from the south, where the trail is gentler and passes several springs.",
        "On clear days the summit offers views across several valleys and, in the far distance, the sea.",
        "Snow lingers in its gullies well into summer, feeding streams that run down to the valley farms.",
        "A small stone hut near the ridge offers shelter to climbers caught out by bad weather.",
        "Shepherds have grazed their flocks on its lower meadows for generations, moving them higher each summer.",
        "Sudden changes in weather make it a respected climb even for experienced mountaineers.",
    ),
    "film": (
        "Critics praised its patient pacing and striking photography, though some found the story too slow.",
        "The score became popular in its own right and is still performed in concert halls from time to time.",
        "Audiences were divided on its ending, which remains much discussed among admirers of the film.",
        "Several scenes were improvised during the shoot, according to later recollections of the crew.",
        "The film has since gained a loyal following and is regularly shown at small cinemas and film clubs.",
        "Its opening sequence is often cited as one of the most memorable of its kind.",
        "The production was troubled by bad weather, equipment failures and a very tight budget.",
    ),
    "book": (
        "Reviewers admired its precise language and quiet humour, and several compared it favourably with "
        "the classics of the form.",
        "The book has been translated into a number of languages and remains in print.",
        "Its final chapter is often quoted and has inspired a number of later works by other writers.",
        "Early drafts were reportedly much longer than the published text, and some passages were cut at "
        "the last minute.",
        "The book found a wider audience some years after its first appearance, helped by word of mouth.",
        "Its cover illustration has become almost as well known as the text itself.",
        "Readers often single out its vivid descriptions of ordinary life, from kitchens to railway platforms.",
    ),
    "event": (
        "The programme included talks, exhibitions and an evening of music that ran well past midnight.",
        "Local hotels and guesthouses were fully booked for the occasion, and many visitors stayed with friends.",
        "Volunteers from across the region helped with the preparations, building stages and directing crowds.",
        "Unseasonal rain on the opening day did little to dampen the mood of those who came.",
        "The event is remembered for a spirited closing ceremony and a long procession through the streets.",
        "Press coverage focused on the crowds, the food stalls and the carnival atmosphere.",
        "Several smaller gatherings were held in parallel in cafes, halls and parks around the city.",
    ),
}

LABELS: dict[tuple[str, str], str] = {
    ("person", "birth_year"): "Born",
    ("person", "occupation"): "Occupation",
    ("person", "born_in"): "Birthplace",
    ("person", "studied_at"): "Education",
    ("person", "employer"): "Employer",
    ("city", "population"): "Population",
    ("city", "founded_year"): "Founded",
    ("city", "country"): "Country",
    ("city", "mayor"): "Mayor",
    ("country", "population"): "Population",
    ("country", "official_language"): "Official language",
    ("country", "currency"): "Currency",
    ("country", "capital"): "Capital",
    ("company", "founded_year"): "Founded",
    ("company", "industry"): "Industry",
    ("company", "employees"): "Employees",
    ("company", "founded_by"): "Founder",
    ("company", "headquarters"): "Headquarters",
    ("university", "founded_year"): "Founded",
    ("university", "students"): "Students",
    ("university", "located_in"): "Location",
    ("university", "founded_by"): "Founder",
    ("river", "length_km"): "Length",
    ("river", "flows_through"): "Country",
    ("river", "source"): "Source",
    ("mountain", "elevation_m"): "Elevation",
    ("mountain", "country"): "Country",
    ("film", "release_year"): "Released",
    ("film", "genre"): "Genre",
    ("film", "directed_by"): "Director",
    ("film", "filmed_in"): "Filming location",
    ("film", "based_on"): "Based on",
    ("book", "publication_year"): "Published",
    ("book", "genre"): "Genre",
    ("book", "written_by"): "Author",
    ("book", "publisher"): "Publisher",
    ("event", "year"): "Year",
    ("event", "attendance"): "Attendance",
    ("event", "location"): "Location",
    ("event", "organised_by"): "Organiser",
}
