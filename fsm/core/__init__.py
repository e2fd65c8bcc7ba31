"""The pure core: the lifecycle declaration, the brain, classification, hints, settings, events and messages. No clock, time zone, file or network is read here: facts in, actions out."""
