"""The reference model's dataset: Noto Color Emoji glyphs, rendered to 96x96 RGB on white.

Source: Debian's ``fonts-noto-color-emoji`` (NotoColorEmoji.ttf, SIL Open Font License 1.1).
Single code points above U+2000 that the font maps are rendered with Pillow at size 109
(``embedded_color=True``) onto a white canvas, cropped to their bounding box, padded to a square
with a 6% white margin and resized (LANCZOS) to 96x96. Each glyph gets one class from keywords in
its ``unicodedata.name`` (first matching rule wins); glyphs that match no rule or render empty are
dropped. A fixed 5% of glyphs (seeded) is held out.
"""
from __future__ import annotations

import os
import unicodedata
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFont

FONT_PATH = "/usr/share/fonts/truetype/noto/NotoColorEmoji.ttf"
FONT_SIZE = 109
IMAGE_SIZE = 96
HELDOUT_FRACTION = 0.05
SPLIT_SEED = 1234
MARGIN = 0.06

# Ranges scanned for single code points (all above U+2000).
_RANGES = [(0x2000, 0x2BFF), (0x3000, 0x303F), (0x3290, 0x329F), (0x1F000, 0x1FAFF)]

# (class name, keywords matched as whole words of the unicode name). First match wins, so the
# specific rules come before the broad ones.
CATEGORY_RULES: list[tuple[str, tuple[str, ...]]] = [
    ("cat", ("CAT", "KITTEN", "LION", "TIGER", "LEOPARD")),
    ("dog", ("DOG", "POODLE", "WOLF", "FOX")),
    ("animal", ("MONKEY", "GORILLA", "ORANGUTAN", "HORSE", "UNICORN", "ZEBRA", "DEER", "BISON", "COW", "OX", "BUFFALO", "PIG", "BOAR", "RAM", "SHEEP", "EWE", "GOAT", "CAMEL", "LLAMA", "GIRAFFE", "ELEPHANT", "MAMMOTH", "RHINOCEROS", "HIPPOPOTAMUS", "MOUSE", "RAT", "HAMSTER", "RABBIT", "CHIPMUNK", "BEAVER", "HEDGEHOG", "BAT", "BEAR", "KOALA", "PANDA", "SLOTH", "OTTER", "SKUNK", "KANGAROO", "BADGER", "PAW", "FROG", "CROCODILE", "TURTLE", "LIZARD", "SNAKE", "DRAGON", "SAUROPOD", "T-REX", "RACCOON", "MOOSE", "DONKEY")),
    ("face", ("FACE", "GRINNING", "SMILING", "WINKING", "KISSING", "SKULL", "ALIEN", "OGRE", "GOBLIN", "CLOWN")),
    ("heart", ("HEART", "HEARTS")),
    ("hand", ("HAND", "HANDS", "FINGER", "FINGERS", "THUMBS", "FIST", "PALM", "PALMS", "FINGERED", "CLAPPING", "WAVING", "OK")),
    ("bird", ("BIRD", "CHICKEN", "ROOSTER", "CHICK", "PENGUIN", "EAGLE", "DUCK", "OWL", "TURKEY", "DOVE", "PARROT", "PEACOCK", "FLAMINGO", "SWAN", "DODO", "HATCHING", "GOOSE", "FEATHER")),
    ("sea life", ("FISH", "TROPICAL", "DOLPHIN", "WHALE", "OCTOPUS", "SHARK", "SHELL", "CRAB", "LOBSTER", "SHRIMP", "SQUID", "OYSTER", "SEAL", "JELLYFISH", "CORAL", "BLOWFISH")),
    ("bug", ("BUG", "ANT", "HONEYBEE", "BEETLE", "SPIDER", "SCORPION", "MOSQUITO", "CRICKET", "BUTTERFLY", "SNAIL", "WORM", "MICROBE", "FLY", "COCKROACH", "LADY")),
    ("flower", ("FLOWER", "BLOSSOM", "ROSE", "HIBISCUS", "SUNFLOWER", "TULIP", "BOUQUET", "ROSETTE", "LOTUS", "HYACINTH")),
    ("plant", ("TREE", "PALM", "CACTUS", "HERB", "SHAMROCK", "CLOVER", "LEAF", "LEAVES", "SEEDLING", "MUSHROOM", "PLANT", "NEST", "WOOD", "RICE", "SHEAF")),
    ("fruit & veg", ("GRAPES", "MELON", "WATERMELON", "TANGERINE", "LEMON", "BANANA", "PINEAPPLE", "MANGO", "APPLE", "PEAR", "PEACH", "CHERRIES", "STRAWBERRY", "BLUEBERRIES", "KIWIFRUIT", "TOMATO", "OLIVE", "COCONUT", "AVOCADO", "AUBERGINE", "POTATO", "CARROT", "CORN", "PEPPER", "CUCUMBER", "BROCCOLI", "GARLIC", "ONION", "PEANUTS", "CHESTNUT", "BEANS", "PEA", "GINGER", "VEGETABLE")),
    ("drink", ("BEVERAGE", "COFFEE", "TEA", "TEACUP", "SAKE", "BOTTLE", "WINE", "COCKTAIL", "BEER", "MUGS", "GLASSES", "TUMBLER", "CUP", "STRAW", "MATE", "MILK", "BABY BOTTLE", "ICE", "CHAMPAGNE", "POURING", "TEAPOT", "BUBBLE")),
    ("food", ("BREAD", "CROISSANT", "BAGUETTE", "FLATBREAD", "PRETZEL", "BAGEL", "PANCAKES", "WAFFLE", "CHEESE", "MEAT", "POULTRY", "BACON", "HAMBURGER", "FRIES", "PIZZA", "HOT", "SANDWICH", "TACO", "BURRITO", "TAMALE", "STUFFED", "FALAFEL", "EGG", "COOKING", "SHALLOW", "POT", "FONDUE", "BOWL", "SALAD", "POPCORN", "BUTTER", "SALT", "CANNED", "BENTO", "CRACKER", "RICE", "CURRY", "SPAGHETTI", "SWEET", "ODEN", "SUSHI", "FRIED", "FISH CAKE", "MOON CAKE", "DANGO", "DUMPLING", "FORTUNE", "TAKEOUT", "SOFT", "SHAVED", "ICE CREAM", "DOUGHNUT", "COOKIE", "BIRTHDAY", "SHORTCAKE", "CUPCAKE", "PIE", "CHOCOLATE", "CANDY", "LOLLIPOP", "CUSTARD", "HONEY", "FOOD", "STEW", "CHOPSTICKS", "FORK", "SPOON", "KNIFE", "JAR", "DUMPLING")),
    ("person", ("MAN", "WOMAN", "PERSON", "PEOPLE", "BOY", "GIRL", "BABY", "CHILD", "ADULT", "OLDER", "PRINCE", "PRINCESS", "ANGEL", "SANTA", "MRS", "FAIRY", "MAGE", "VAMPIRE", "MERPERSON", "ELF", "GENIE", "ZOMBIE", "TROLL", "GUARDSMAN", "DETECTIVE", "NINJA", "CONSTRUCTION WORKER", "DANCER", "BUST", "BUSTS", "SILHOUETTE", "COUPLE", "FAMILY", "HEAD", "SPEAKING", "BRIDE", "POLICE", "SUPERHERO", "SUPERVILLAIN", "EAR", "NOSE", "EYE", "EYES", "MOUTH", "TONGUE", "LIPS", "LEG", "FOOT", "BRAIN", "TOOTH", "BONE", "MUSCLE")),
    ("vehicle", ("CAR", "AUTOMOBILE", "TAXI", "BUS", "TROLLEYBUS", "MINIBUS", "AMBULANCE", "FIRE ENGINE", "TRUCK", "LORRY", "TRACTOR", "RACING", "MOTORCYCLE", "SCOOTER", "BICYCLE", "SKATEBOARD", "ROLLER", "TRAIN", "LOCOMOTIVE", "RAILWAY", "TRAM", "METRO", "MONORAIL", "HIGH-SPEED", "STATION", "SHIP", "BOAT", "SAILBOAT", "CANOE", "SPEEDBOAT", "FERRY", "AIRPLANE", "HELICOPTER", "ROCKET", "SATELLITE", "SAUCER", "SEAT", "SUSPENSION", "MOUNTAIN CABLEWAY", "AERIAL", "CABLEWAY", "WHEEL", "FUEL", "VEHICLE", "PARACHUTE", "ANCHOR", "WHEELCHAIR", "KICK", "AUTO", "RICKSHAW", "PICKUP", "POLICE CAR")),
    ("building", ("HOUSE", "HOUSES", "BUILDING", "HOME", "OFFICE", "POST", "HOSPITAL", "BANK", "HOTEL", "LOVE HOTEL", "CONVENIENCE", "SCHOOL", "DEPARTMENT", "FACTORY", "CASTLE", "WEDDING", "TOWER", "STATUE", "CHURCH", "MOSQUE", "TEMPLE", "SYNAGOGUE", "SHINTO", "KAABA", "FOUNTAIN", "TENT", "CITYSCAPE", "BRIDGE", "STADIUM", "HUT", "STORE", "CLASSICAL", "DERELICT", "CAROUSEL", "FERRIS", "CIRCUS", "NATIONAL PARK", "MOUNTAIN", "VOLCANO", "FUJI", "CAMPING", "BEACH", "DESERT", "ISLAND", "MAP", "GLOBE", "SUNRISE", "NIGHT", "SUNSET", "DUSK", "FOGGY", "MILKY", "PLAYGROUND", "ROCK", "BRICK", "BARBER")),
    ("weather & sky", ("SUN", "MOON", "STAR", "STARS", "CLOUD", "RAIN", "SNOW", "SNOWFLAKE", "SNOWMAN", "UMBRELLA", "THUNDER", "LIGHTNING", "HIGH VOLTAGE", "TORNADO", "FOG", "WIND", "CYCLONE", "RAINBOW", "COMET", "DROPLET", "WATER", "WAVE", "FIRE", "FLAME", "THERMOMETER", "EARTH", "PLANET", "RINGED", "CRESCENT", "SPARKLES", "SPARKLE", "DIZZY", "HOLE")),
    ("sport & game", ("BALL", "SOCCER", "BASEBALL", "SOFTBALL", "BASKETBALL", "VOLLEYBALL", "FOOTBALL", "RUGBY", "TENNIS", "FLYING DISC", "BOWLING", "CRICKET", "HOCKEY", "LACROSSE", "PING", "BADMINTON", "BOXING", "MARTIAL", "GOAL", "GOLF", "SKATE", "FISHING", "DIVING", "RUNNING", "SKI", "SKIS", "SLED", "CURLING", "DIRECT HIT", "YO-YO", "KITE", "BILLIARDS", "CRYSTAL", "MAGIC", "NAZAR", "VIDEO GAME", "JOYSTICK", "SLOT", "GAME", "DIE", "PUZZLE", "TEDDY", "PINATA", "MIRROR BALL", "NESTING", "CHESS", "PLAYING CARD", "MAHJONG", "FLOWER PLAYING", "MEDAL", "TROPHY", "SPORTS", "TICKET", "TICKETS", "FIREWORKS", "SPARKLER", "FIRECRACKER", "BALLOON", "PARTY", "CONFETTI", "TANABATA", "PINE", "DOLLS", "CARP", "WIND CHIME", "RIBBON", "WRAPPED", "REMINDER", "JACK-O-LANTERN", "CHRISTMAS")),
    ("music & art", ("MUSICAL", "MUSIC", "NOTE", "NOTES", "STUDIO", "MICROPHONE", "HEADPHONE", "RADIO", "SAXOPHONE", "ACCORDION", "GUITAR", "KEYBOARD", "TRUMPET", "VIOLIN", "BANJO", "DRUM", "LONG DRUM", "MARACAS", "FLUTE", "SPEAKER", "BELL", "POSTAL HORN", "CINEMA", "CAMERA", "FILM", "MOVIE", "CLAPPER", "TELEVISION", "VIDEOCASSETTE", "ARTIST", "PALETTE", "PERFORMING", "THREAD", "YARN", "SEWING", "KNOT", "FRAME")),
    ("clothes", ("GLASSES", "SUNGLASSES", "GOGGLES", "COAT", "NECKTIE", "SHIRT", "JEANS", "SCARF", "GLOVES", "SOCKS", "DRESS", "KIMONO", "SARI", "SWIMSUIT", "BRIEFS", "SHORTS", "BIKINI", "CLOTHING", "PURSE", "HANDBAG", "POUCH", "BAGS", "BACKPACK", "THONG", "SHOE", "SANDAL", "BOOT", "HAT", "CAP", "HELMET", "CROWN", "TOP HAT", "LIPSTICK", "RING", "GEM", "BEADS", "COMB", "HAIR", "FAN", "T-SHIRT", "BALLET", "FLAT", "HEELED", "SNEAKER", "LAB")),
    ("tool & object", ("HAMMER", "AXE", "PICK", "WRENCH", "SCREWDRIVER", "NUT", "BOLT", "GEAR", "CLAMP", "BALANCE", "CHAIN", "CHAINS", "HOOK", "TOOLBOX", "MAGNET", "LADDER", "ALEMBIC", "TEST", "PETRI", "DNA", "MICROSCOPE", "TELESCOPE", "ANTENNA", "SYRINGE", "PILL", "STETHOSCOPE", "BANDAGE", "CRUTCH", "X-RAY", "DOOR", "ELEVATOR", "WINDOW", "BED", "COUCH", "CHAIR", "TOILET", "PLUNGER", "SHOWER", "BATHTUB", "RAZOR", "LOTION", "SAFETY", "BROOM", "BASKET", "ROLL", "BUCKET", "SOAP", "SPONGE", "EXTINGUISHER", "CART", "CIGARETTE", "COFFIN", "HEADSTONE", "FUNERAL", "MOAI", "PLACARD", "IDENTIFICATION", "KEY", "LOCK", "LOCKED", "SWORD", "SWORDS", "DAGGER", "PISTOL", "BOW", "SHIELD", "BOOMERANG", "CARPENTRY", "SAW", "PHONE", "TELEPHONE", "MOBILE", "PAGER", "FAX", "BATTERY", "PLUG", "COMPUTER", "LAPTOP", "DESKTOP", "PRINTER", "TRACKBALL", "DISK", "MINIDISC", "FLOPPY", "OPTICAL", "DVD", "ABACUS", "LIGHT", "BULB", "FLASHLIGHT", "LANTERN", "CANDLE", "LAMP", "DIYA", "BOOK", "BOOKS", "NOTEBOOK", "LEDGER", "PAGE", "SCROLL", "NEWSPAPER", "BOOKMARK", "LABEL", "MONEY", "MONEYBAG", "COIN", "YEN", "DOLLAR", "EURO", "POUND", "BANKNOTE", "CREDIT", "RECEIPT", "ENVELOPE", "E-MAIL", "INBOX", "OUTBOX", "PACKAGE", "MAILBOX", "BALLOT", "PENCIL", "PEN", "FOUNTAIN PEN", "PAINTBRUSH", "CRAYON", "MEMO", "BRIEFCASE", "FOLDER", "CALENDAR", "CARD", "CHART", "CLIPBOARD", "PUSHPIN", "PAPERCLIP", "PAPERCLIPS", "RULER", "SCISSORS", "FILE", "WASTEBASKET", "WATCH", "CLOCK", "ALARM", "STOPWATCH", "TIMER", "HOURGLASS", "MAGNIFYING", "TROLLEY", "LUGGAGE", "PROBING", "BOX", "CABINET", "MIRROR", "BLOOD", "DROP", "AMPHORA", "BOMB", "HOOK", "TOOLS", "FLAG")),
]


@dataclass
class Glyph:
    char: str
    name: str
    label: int


def class_names() -> list[str]:
    return [name for name, _ in CATEGORY_RULES]


# Substring overrides checked before the keyword rules: class name, or None to drop the glyph.
OVERRIDES: list[tuple[str, str | None]] = [
    ("ARROW", None), ("FLAG", None), ("SQUARED", None), ("BUTTON", None), ("KEYCAP", None),
    ("CANCELLATION", None), ("SPEECH", None), ("BUBBLE", None), ("BALLOON", None), ("CIRCLED", None),
    ("NEGATIVE", None), ("LETTER", None), ("DIGIT", None), ("EMOJI COMPONENT", None), ("SYMBOL", None),
    ("SPEECH BALLOON", None), ("BUBBLE TEA", "drink"),
    ("CLOCK", "tool & object"), ("HOURGLASS", "tool & object"), ("HOT DOG", "food"),
    ("ICE CREAM", "food"), ("SHAVED ICE", "food"), ("SOFT ICE", "food"), ("FRIED SHRIMP", "food"),
    ("FISH CAKE", "food"), ("RICE", "food"), ("ICE SKATE", "sport & game"), ("ICE HOCKEY", "sport & game"),
    ("WATER POLO", "sport & game"), ("CRICKET BAT", "sport & game"), ("HORSE RACING", "sport & game"),
    ("MAHJONG", "sport & game"), ("TROPICAL DRINK", "drink"), ("PALM TREE", "plant"),
    ("FISHING POLE", "sport & game"), ("BULLET NOSE", "vehicle"), ("POLICE CARS", "vehicle"),
    ("SILHOUETTE OF JAPAN", "building"), ("SCHOOL SATCHEL", "clothes"), ("BICYCLIST", "sport & game"),
    ("FOUNTAIN PEN", "tool & object"), ("LOTUS POSITION", "person"), ("HOLDING HANDS", "person"),
    ("WITH HEART", "heart"), ("FLOWER PLAYING", "sport & game"), ("PERSON WITH BALL", "sport & game"),
    ("MOUSE TRAP", "tool & object"), ("SATELLITE ANTENNA", "tool & object"), ("OIL DRUM", "tool & object"),
    ("SPIRAL NOTE PAD", "tool & object"), ("RING BUOY", "vehicle"), ("LOTION", "tool & object"),
    ("SKI AND SKI", "sport & game"), ("TRAFFIC", "vehicle"),
]


def categorize(name: str) -> int | None:
    names = class_names()
    for key, cls in OVERRIDES:
        if key in name:
            return None if cls is None else names.index(cls)
    words = name.replace("-", " - ").split()
    words = set(name.split()) | set(words)
    for i, (_, keys) in enumerate(CATEGORY_RULES):
        for k in keys:
            if " " in k:
                if k in name:
                    return i
            elif k in words:
                return i
    return None


# ------------------------------------------------------------------------------------------------
# Data set version 2: fewer, clearer classes (what ships). Built from the version-1 glyphs and split
# (the same held-out glyphs, so the VQ and the v1 model never saw them): each v1 class maps to a v2
# class or is dropped; name substrings move or drop single glyphs first. Dropped: the v1 classes
# "tool & object" (but its clock faces), "sport & game", "music & art" and "clothes", a miscellany
# no classifier (or person) can tell apart from a 96x96 picture.
# ------------------------------------------------------------------------------------------------
DATA_VERSION = 2
V2_CLASSES = ["face", "heart", "hand", "person", "animal", "plant", "food", "vehicle", "building", "clock", "sky"]
V2_FROM_V1 = {"face": "face", "heart": "heart", "hand": "hand", "person": "person", "cat": "animal",
              "dog": "animal", "animal": "animal", "bird": "animal", "sea life": "animal", "bug": "animal",
              "flower": "plant", "plant": "plant", "fruit & veg": "food", "food": "food",
              "drink": "food", "vehicle": "vehicle", "building": "building", "weather & sky": "sky"}
# (whole words of the unicode name, v2 class or None to drop), checked in order before V2_FROM_V1
V2_OVERRIDES: list[tuple[str, str | None]] = [
    ("CLOCK FACE", "clock"), ("MOON CAKE", "food"), ("MOON VIEWING", None), ("MOON", "sky"),
    ("SUN WITH FACE", "sky"), ("WIND BLOWING FACE", "sky"), ("WIND CHIME", None), ("GESTURE", "person"),
    ("POUTING FACE", "person"), ("FACE PALM", "person"), ("FACE MASSAGE", "person"), ("HAPPY PERSON", "person"),
    ("POLICE CAR", "vehicle"), ("EAR OF MAIZE", "food"), ("HEART HANDS", "hand"),
    ("SMILING FACE WITH HEART-SHAPED EYES", "face"), ("SMILING FACE WITH SMILING EYES AND THREE HEARTS", "face"),
    ("CAT FACE", "animal"), ("CAROUSEL", None), ("SPIDER WEB", None), ("HOT SPRINGS", None), ("DAGGER", None),
    ("ALIEN", None), ("OGRE", None), ("GOBLIN", None), ("SKULL", None), ("ROBOT", None), ("CLOWN", None),
    ("DOTTED", None), ("COUPLE", None), ("ANATOMICAL", None), ("BUST", None), ("BUSTS", None),
    ("SPEAKING", None), ("SPEAKER", None), ("HEARING", None), ("MECHANICAL", None), ("SEAT", None),
    ("FUEL", None), ("WHEEL", None), ("ANCHOR", None), ("PARACHUTE", None), ("BUOY", None), ("TRAFFIC", None),
    ("STATION", None), ("STOP", None), ("TRACK", None), ("COASTER", None), ("SKATE", None),
    ("MAP", None), ("GLOBE", None), ("SILHOUETTE", None), ("ROCK", None), ("BRICK", None), ("BARBER", None),
    ("FOGGY", None), ("NIGHT", None), ("SUNRISE", None), ("SUNSET", None), ("DUSK", None), ("MILKY", None),
    ("MOUNTAIN", None), ("VOLCANO", None), ("FUJI", None), ("CAMPING", None), ("BEACH", None),
    ("DESERT", None), ("PARK", None), ("THERMOMETER", None), ("HOLE", None), ("DIZZY", None), ("PAW", None),
    ("FEATHER", None), ("NEST", None), ("WOOD", None), ("DAVID", None), ("CRESCENT", None),
    ("SIX POINTED", None), ("CLOSET", None), ("EXTINGUISHER", None),
]
# body parts (v1 "person") are dropped by their exact name
V2_DROP_NAMES = {"EYES", "EYE", "EAR", "NOSE", "MOUTH", "TONGUE", "BONE", "LEG", "FOOT", "TOOTH", "BRAIN",
                 "ANATOMICAL HEART", "LUNGS"}


def categorize_v2(name: str, v1_class: str) -> int | None:
    if name in V2_DROP_NAMES:
        return None
    for key, cls in V2_OVERRIDES:
        if f" {key} " in f" {name} ":
            return None if cls is None else V2_CLASSES.index(cls)
    cls = V2_FROM_V1.get(v1_class)
    return None if cls is None else V2_CLASSES.index(cls)


def build_dataset_v2(cache_v1: str | None = None, verbose: bool = True) -> dict:
    """Data set version 2 from version 1 (same glyphs, renders and held-out split; v2 classes)."""
    ds = build_dataset(cache_v1, verbose=False)
    v1_names = ds["class_names"]
    labels = [categorize_v2(n, v1_names[int(l)]) for n, l in zip(ds["names"], ds["labels"])]
    keep = np.array([l is not None for l in labels])
    out = {"images": ds["images"][keep], "labels": np.array([l for l in labels if l is not None], np.int64),
           "chars": [c for c, k in zip(ds["chars"], keep) if k], "names": [n for n, k in zip(ds["names"], keep) if k],
           "class_names": list(V2_CLASSES), "heldout": ds["heldout"][keep]}
    if verbose:
        counts = np.bincount(out["labels"], minlength=len(V2_CLASSES))
        ho = np.bincount(out["labels"][out["heldout"]], minlength=len(V2_CLASSES))
        print(f"[data v2] {len(out['labels'])} glyphs, {out['heldout'].sum()} held out")
        for name, c, h in zip(V2_CLASSES, counts, ho):
            print(f"[data v2]   {name:14s} {c:4d} ({h} held out)")
    return out


_FONT = None


def _font():
    global _FONT
    if _FONT is None:
        if not os.path.exists(FONT_PATH):
            raise FileNotFoundError(
                f"{FONT_PATH} not found: install Debian's fonts-noto-color-emoji "
                "(apt-get install -y fonts-noto-color-emoji)")
        _FONT = ImageFont.truetype(FONT_PATH, FONT_SIZE)
    return _FONT


def render_raw(ch: str) -> np.ndarray:
    """Render one glyph on a white 200x200 canvas, return uint8 HxWx3."""
    canvas = Image.new("RGB", (200, 200), (255, 255, 255))
    ImageDraw.Draw(canvas).text((20, 20), ch, font=_font(), embedded_color=True)
    return np.asarray(canvas)


def render(ch: str) -> np.ndarray | None:
    """Render, crop to the glyph's bounding box, pad square with a white margin, resize to 96x96.

    Returns uint8 96x96x3, or None when the glyph renders empty."""
    a = render_raw(ch)
    ink = (a < 250).any(axis=2)
    if ink.sum() < 30:
        return None
    ys, xs = np.nonzero(ink)
    y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
    crop = a[y0:y1, x0:x1]
    h, w = crop.shape[:2]
    side = int(round(max(h, w) * (1 + 2 * MARGIN)))
    sq = np.full((side, side, 3), 255, np.uint8)
    oy, ox = (side - h) // 2, (side - w) // 2
    sq[oy:oy + h, ox:ox + w] = crop
    return np.asarray(Image.fromarray(sq).resize((IMAGE_SIZE, IMAGE_SIZE), Image.LANCZOS))


def candidate_glyphs() -> list[Glyph]:
    out = []
    for lo, hi in _RANGES:
        for cp in range(lo, hi + 1):
            ch = chr(cp)
            name = unicodedata.name(ch, "")
            if not name:
                continue
            label = categorize(name)
            if label is None:
                continue
            out.append(Glyph(ch, name, label))
    return out


def _notdef_signature() -> bytes:
    return render_raw(chr(0xE000)).tobytes()


def build_dataset(cache_path: str | None = None, verbose: bool = True) -> dict:
    """All categorised, non-empty glyphs: dict with images uint8[N,96,96,3], labels int64[N],
    chars, names, class_names, heldout bool[N]. Cached as .npz (no pickle) when cache_path is given."""
    if cache_path and os.path.exists(cache_path):
        z = np.load(cache_path, allow_pickle=False)
        return {k: (z[k].tolist() if z[k].dtype.kind == "U" else z[k]) for k in z.files}
    notdef = _notdef_signature()
    imgs, labels, chars, names = [], [], [], []
    for g in candidate_glyphs():
        if render_raw(g.char).tobytes() == notdef:
            continue
        im = render(g.char)
        if im is None:
            continue
        imgs.append(im)
        labels.append(g.label)
        chars.append(g.char)
        names.append(g.name)
    n = len(imgs)
    rng = np.random.default_rng(SPLIT_SEED)
    heldout = np.zeros(n, bool)
    heldout[rng.permutation(n)[: max(1, int(round(n * HELDOUT_FRACTION)))]] = True
    ds = {
        "images": np.stack(imgs),
        "labels": np.asarray(labels, np.int64),
        "chars": chars,
        "names": names,
        "class_names": class_names(),
        "heldout": heldout,
    }
    # drop classes that ended up empty? keep indices stable: every class must have glyphs
    if verbose:
        counts = np.bincount(ds["labels"], minlength=len(CATEGORY_RULES))
        print(f"[data] {n} glyphs, {heldout.sum()} held out")
        for name, c in zip(class_names(), counts):
            print(f"[data]   {name:14s} {c}")
    if cache_path:
        os.makedirs(os.path.dirname(cache_path) or ".", exist_ok=True)
        np.savez(cache_path, images=ds["images"], labels=ds["labels"], chars=np.asarray(chars),
                 names=np.asarray(names), class_names=np.asarray(ds["class_names"]), heldout=heldout)
    return ds


def augment(images: np.ndarray, rng: np.random.Generator, max_shift: int = 4,
            scale_range: tuple[float, float] = (0.88, 1.0)) -> np.ndarray:
    """Light augmentation: random down-scale and shift, on white. uint8[N,96,96,3] -> same."""
    out = np.full_like(images, 255)
    S = images.shape[1]
    for i, im in enumerate(images):
        s = rng.uniform(*scale_range)
        side = max(8, int(round(S * s)))
        small = np.asarray(Image.fromarray(im).resize((side, side), Image.LANCZOS)) if side != S else im
        free = S - side
        dy = int(np.clip(free // 2 + rng.integers(-max_shift, max_shift + 1), 0, free)) if free else 0
        dx = int(np.clip(free // 2 + rng.integers(-max_shift, max_shift + 1), 0, free)) if free else 0
        if free == 0:
            # shift by rolling in white
            sy, sx = rng.integers(-max_shift // 2, max_shift // 2 + 1, size=2)
            canvas = np.full((S + 2 * max_shift, S + 2 * max_shift, 3), 255, np.uint8)
            canvas[max_shift:max_shift + S, max_shift:max_shift + S] = im
            out[i] = canvas[max_shift - sy:max_shift - sy + S, max_shift - sx:max_shift - sx + S]
        else:
            out[i, dy:dy + side, dx:dx + side] = small
    return out


def to_tensor(images: np.ndarray):
    import torch
    return torch.from_numpy(images).permute(0, 3, 1, 2).float().div(255.0)


def contact_sheet(images: np.ndarray, cols: int = 16) -> Image.Image:
    n = len(images)
    rows = (n + cols - 1) // cols
    S = images.shape[1]
    sheet = np.full((rows * S, cols * S, 3), 255, np.uint8)
    for i, im in enumerate(images):
        r, c = divmod(i, cols)
        sheet[r * S:(r + 1) * S, c * S:(c + 1) * S] = im
    return Image.fromarray(sheet)
