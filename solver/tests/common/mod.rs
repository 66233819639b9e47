// generators of random problems for property tests (being written)
