"""The word list of ``turnrl/Wordle-v0``: 1200 common 5-letter lowercase English words.

``WORDS`` is ordered from most to least frequent, so ``WORDS[:n]`` is the ``n`` most common
words (the Wordle env's ``vocab_size``). Provenance: the 5-letter all-lowercase entries of
SCOWL size 35 (Debian's ``wamerican-small``, Kevin Atkinson's permissive word-list licence),
without plurals and ``-ed``/``-ies``/``-ied`` inflections of shorter entries, ranked by English
word frequency (the ``wordfreq`` package, used only to order and cut the list), minus slang
and offensive words, cut at the 1200 most frequent.
"""

from __future__ import annotations

__all__ = ["WORDS", "WORD_LENGTH"]

WORD_LENGTH = 5

_TEXT = """
about their there which would other after first think could these where
right being going still never those world great while every state three
since under thing house place again found might money night until doing
group women start today point music power water small white later order
party thank using black whole maybe story least early local video young
court given level often death south known large wrong along class close
cause happy human woman leave north watch light short taken third among
check heart child major media phone quite final front ready bring heard
march study clear month board field fight force issue price space total
above share sense break event sorry guess learn alone movie press worth
sound value round stand stuff drive green match model trust range trade
chief lower style blood china stage title enjoy cover legal seven staff
super union began built crazy daily paper voice whose earth below offer
sleep table truth build piece visit wrote river shall speak write album
eight funny peace spent store track ahead allow brown radio cross focus
speed extra quick agree clean photo scene spend coach heavy train claim
hotel judge brain floor image meant reach civil dance stock worst beach
older color dream grand sweet touch doubt drink shown basic carry crime
fully plant smith worse award block peter avoid catch coast trial truly
queen broke glass prior royal serve begin twice worry brand count fresh
mouth owner scale score smart throw click faith metal agent apply basis
enter prime waste weird adult grade stone apart aware fifth proud birth
labor lucky prove tough alive apple dress horse magic stick frank guide
raise treat youth exist guard shoot solid sport taste harry hello plane
shape upper cheap joint steel crowd enemy limit ocean proof chair honor
email stuck sugar drama entry grant grown lying route smoke squad teach
abuse angry laugh lunch storm actor chain equal quiet split urban fault
phase smile truck blame dying false novel shirt cream giant mayor minor
theme usual draft drunk spoke upset cycle aside empty prize rural admit
favor frame guest teeth bunch fruit index shift stood tight crown grace
chose crash depth dirty error noise panel plate shame bible cable print
sight broad drawn motor solar blind brief chest debut paint pilot steam
exact quote swear trend bread inner reply tower wheel pride rough smell
topic sharp trick audio chart mount occur argue awful bound cloud loose
moral shock thick threw angel bonus flash gross refer trail uncle badly
chase ideal clock label naked pitch pizza plain anger comic ghost newly
skill solve trash virus boost crack knife saint steal buddy delay elite
forth layer marry nurse rugby sheet bench medal shell silly angle forum
grass hence rapid sixth valid vital creek fraud honey ratio scary spell
sword begun daddy drove glory juice logic strip dozen fancy input knock
ought flood rally swing alert arena brave fleet robin shake shore blast
pound punch fewer grave mouse piano slave craft devil sauce slide tiger
alien beast candy fifty relax alarm globe spare chaos corps opera quest
lover panic scope alpha brick mercy outer screw venue habit naval noble
robot toxic wider wound asset baker brush essay maker snake ultra usage
canal climb fever fluid nasty twist unity blown fence stole dealt flesh
forty laser loyal patch radar villa adopt blade cargo humor nerve sandy
sheep trace chill grain liver metro rifle rival sadly slept spray suite
verse bless chuck couch crush genre lease shine tweet react rocky shade
vocal yield bacon burst salad stake swift awake blank curve harsh hurry
mason organ pearl sweat alike arrow cabin eagle eaten guilt haven theft
valve charm cruel delta ridge tribe canon stamp voter witch array belly
booth cliff fatal lemon shark dairy diary drill jeans meter olive safer
skull smash basin breed bride chick fairy freak grief lodge merit rebel
tooth viral widow beard curse drain flame ninth penny petty reign scare
sunny cheat cheer chile demon elder fiber pulse realm shout alter graph
shook stack aging audit spite burnt buyer cease cloth eager elect lobby
orbit ranch trunk badge carol ferry gauge rider shelf width loser sheer
stark thumb wheat wrist acute civic clerk crude drone flour minus pause
puppy slice vinyl probe sneak spark steep straw weigh adapt dense kitty
whale amber ankle armor berry clash grasp handy poker sally scout steak
sweep tumor cheek curry polar skirt spike toast waist wreck blend brake
cough depot drank feast frost purse tense chess float grind grove hobby
lance newer risky sober spice swept towel arise bloom clown dodge guild
prone siege sixty sonic spine crane donor pasta tenth batch paste plaza
stare blunt champ ditch scrap shaft slope snack stern stiff sworn unite
vault wagon midst onion rogue abbey baron bunny choir holly shiny spoon
thief alley bully marsh messy roast salon vague coral dough hardy irony
maple relay risen stunt ivory niche porch utter creep elbow exile goose
grill ruler spill swamp tasty urine decay flown imply merry reset shave
vodka drift hatch niece scent slate surge token woody yacht manor pupil
spoil altar atlas fatty flush hairy ounce seize spicy sting raven stall
strap bliss daisy disco faint forge notch omega queue trout bravo crawl
digit flint jelly lunar peach cedar heath pinch syrup dwarf liner merge
naive rigid vivid boxer brook hedge joker laden rainy salty serum skate
stray tempo torch arose blink chili excel genus glove greed greet owing
proxy renew rumor stoke thigh troll aisle bleed brace choke motto onset
prose razor steer ample bingo cubic shady slack slick stove tract vista
vogue adore creed crisp crust flora gamma grape juicy moody prank spear
stain tidal wrath blaze chalk flock moist rabbi scoop scrub trait troop
clone drown jewel obese scarf timer tying borne dusty focal noisy snail
tutor verge yeast erase manly oxide pence repay rouge shove basil booze
chord crest fetch fuzzy nicer optic panda slash baton camel chunk cocoa
comet dread dummy flank flare lever pedal query sewer smack swell align
attic await cache flick groom lyric plead debit gamer paddy tally wedge
alloy crank linen moose motel resin rusty stint weary agony caste chant
colon curly fetus mound muddy abide avail madam poppy tease bluff flyer
miner needy patty swipe tango blitz cigar circa cloak dwell fiery goofy
jolly mummy purge rhino venom windy blush furry mango oasis oddly pagan
psalm rhyme savvy spree vapor witty woven amend blond bowel cater deity
finch sedan slang algae dolly dryer ethic flair haunt hazel slain viola
adobe brawl quota swore vomit weave denim erect fauna flirt flute matte
stool tread truce unfit aloud boast brink cobra sigma usher annex barge
birch bland bribe canoe cider equip havoc humid milky mixer pivot suing
arbor cling icing lapse mimic mural nasal cameo deter diner envoy fungi
gravy psych rinse scalp squat thorn wharf wiser crate crave gloss graft
guise leash rodeo shire swung taboo alias annoy liter opium penal plank
privy siren smear snowy stalk stink swine clamp inlet kudos quake racer
recap shaky stout stump berth mania patio prism roach sniff squid swarm
abbot aspen bleak dizzy enact hound mourn pouch shack stale tummy wager
"""

WORDS: tuple[str, ...] = tuple(_TEXT.split())
"""The words, most frequent first (unique, ``WORD_LENGTH`` lowercase ASCII letters each)."""
