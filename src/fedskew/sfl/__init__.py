"""fedskew.sfl"""
