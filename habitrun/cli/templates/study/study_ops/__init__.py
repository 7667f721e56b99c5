"""This study's operators: habitrun imports them from the recipe's folder."""
