"""fedskew.engine"""
