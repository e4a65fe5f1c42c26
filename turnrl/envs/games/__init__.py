"""Games: feedback and puzzle envs with exact verifiers and scripted experts (guess the number,
Mastermind, Wordle, FrozenLake, Sokoban, KeyDoor, the ALFWorld-style household)."""
