"""Value pools the task generator draws from (names, places, words)."""

CITIES = ("Paris", "London", "Berlin", "Madrid", "Rome", "Lisbon", "Vienna", "Prague", "Warsaw", "Oslo",
          "Stockholm", "Helsinki", "Dublin", "Athens", "Cairo", "Nairobi", "Lagos", "Tokyo", "Seoul", "Beijing",
          "Delhi", "Mumbai", "Sydney", "Toronto", "Chicago", "Boston", "Denver", "Lima", "Bogota", "Santiago",
          "Mexico City", "New York", "San Francisco", "Cape Town", "Buenos Aires", "Amsterdam", "Brussels",
          "Zurich", "Munich", "Milan")
COUNTRIES = ("France", "Germany", "Spain", "Italy", "Portugal", "Austria", "Poland", "Norway", "Sweden",
             "Finland", "Ireland", "Greece", "Egypt", "Kenya", "Nigeria", "Japan", "Korea", "China", "India",
             "Australia", "Canada", "Mexico", "Peru", "Chile", "Brazil", "Argentina", "Belgium", "Switzerland",
             "Denmark", "Turkey")
SYMBOLS = ("AAPL", "MSFT", "GOOG", "AMZN", "NVDA", "TSLA", "META", "IBM", "ORCL", "INTC", "AMD", "NFLX",
           "ADBE", "CSCO", "SAP", "SONY", "UBER", "SHOP", "PYPL", "QCOM")
CURRENCIES = ("USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "SEK", "NOK", "INR")
PEOPLE = ("Alice Martin", "Bob Smith", "Carol Jones", "David Brown", "Emma Wilson", "Frank Miller",
          "Grace Lee", "Henry Clark", "Irene Lopez", "Jack White", "Karen Hall", "Liam Young", "Maria Garcia",
          "Noah King", "Olivia Scott", "Paul Green", "Rosa Adams", "Sam Baker", "Tina Nelson", "Victor Hill",
          "Wendy Wright", "Yusuf Khan", "Zoe Turner", "Ada Lovelace", "Hugo Weber", "Lena Fischer",
          "Marco Rossi", "Sofia Costa", "Pierre Dubois", "Anna Novak")
SKIES = ("clear", "cloudy", "rainy", "sunny", "foggy", "windy", "snowy", "stormy")
STATUSES = ("shipped", "delivered", "pending", "cancelled", "in transit", "processing")
WORDS = ("apple", "river", "stone", "cloud", "garden", "silver", "window", "forest", "candle", "bridge",
         "orange", "planet", "rocket", "castle", "mirror", "pencil", "violin", "harbor", "desert", "island",
         "tiger", "falcon", "meadow", "summer", "winter", "copper", "marble", "lantern", "anchor", "velvet",
         "batch", "engine", "signal", "puzzle", "canyon", "glacier", "thunder", "basket", "ribbon", "compass")

# Every pool a task copies words from (into arguments, answers and JSON).
POOLS = (CITIES, COUNTRIES, CURRENCIES, PEOPLE, SKIES, STATUSES, SYMBOLS, WORDS)
